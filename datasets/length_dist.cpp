// Named length distributions (see length_dist.h). The samplers are textbook methods over Rng's uniform and normal
// draws: Devroye's rejection for Zipf, multiplication (small mean) or Hoermann's PTRS (mean >= 10) for Poisson.
#include "datasets/length_dist.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "servetune/error.h"

namespace servetune::datasets {
namespace {

// Above this a draw is treated as unbounded (a token count this large is never meant); keeps int64 exact.
constexpr double kLargest = 1e15;

int64_t zipf(double alpha, Rng& rng) {
  const double am1 = alpha - 1.0;
  const double b = std::pow(2.0, am1);
  for (;;) {
    const double u = 1.0 - rng.uniform01();  // (0, 1]
    const double v = rng.uniform01();
    const double x = std::floor(std::pow(u, -1.0 / am1));
    if (x < 1.0 || x > kLargest) continue;
    const double t = std::pow(1.0 + 1.0 / x, am1);
    if (v * x * (t - 1.0) / (b - 1.0) <= t / b) return static_cast<int64_t>(x);
  }
}

int64_t poisson(double mean, Rng& rng) {
  if (mean < 10.0) {
    // Count uniforms until their product drops below e^-mean.
    const double limit = std::exp(-mean);
    int64_t k = 0;
    for (double p = rng.uniform01(); p > limit; p *= rng.uniform01()) ++k;
    return k;
  }
  const double slam = std::sqrt(mean), loglam = std::log(mean);
  const double b = 0.931 + 2.53 * slam, a = -0.059 + 0.02483 * b;
  const double inv_alpha = 1.1239 + 1.1328 / (b - 3.4), vr = 0.9277 - 3.6224 / (b - 2.0);
  for (;;) {
    const double u = rng.uniform01() - 0.5, v = rng.uniform01();
    const double us = 0.5 - std::fabs(u);
    const double k = std::floor((2.0 * a / us + b) * u + mean + 0.43);
    if (us >= 0.07 && v <= vr) return static_cast<int64_t>(k);
    if (k < 0.0 || (us < 0.013 && v > us)) continue;
    if (std::log(v) + std::log(inv_alpha) - std::log(a / (us * us) + b) <= -mean + k * loglam - std::lgamma(k + 1.0)) {
      return static_cast<int64_t>(k);
    }
  }
}

std::string number(double v) {
  std::ostringstream s;
  s.precision(12);
  s << v;
  return s.str();
}

}  // namespace

int64_t LengthDist::sample(Rng& rng) const {
  double x = 0.0;
  if (distribution == "constant") {
    x = value;
  } else if (distribution == "uniform") {
    return rng.uniform_int(static_cast<int64_t>(min), static_cast<int64_t>(*max));
  } else if (distribution == "zipf") {
    x = static_cast<double>(zipf(alpha, rng));
  } else if (distribution == "poisson") {
    x = static_cast<double>(poisson(alpha, rng));
  } else {  // lognormal
    const double mu = by_average ? std::log(average * median_ratio) : mean;
    const double s = by_average ? std::sqrt(2.0 * std::log(1.0 / median_ratio)) : sigma;
    x = std::round(std::exp(mu + s * rng.normal()));
  }
  if (max) x = std::min(x, *max);
  return static_cast<int64_t>(std::clamp(x, 0.0, kLargest));
}

std::string LengthDist::text() const {
  std::string t = distribution + ":";
  if (distribution == "constant") return t + "value=" + number(value);
  if (distribution == "uniform") return t + "min=" + number(min) + ",max=" + number(*max);
  if (distribution == "zipf" || distribution == "poisson") t += "alpha=" + number(alpha);
  if (distribution == "lognormal") {
    t += by_average ? "average=" + number(average) + ",median_ratio=" + number(median_ratio)
                    : "mean=" + number(mean) + ",sigma=" + number(sigma);
  }
  return max ? t + ",max=" + number(*max) : t;
}

LengthDist parse_length_dist(const std::string& text, const std::string& what) {
  const auto fail = [&](const std::string& why) -> void {
    throw_usage((what.empty() ? "" : what + ": ") + why + " in '" + text +
                "' (uniform:min=A,max=B | constant:value=N | zipf:alpha=A[,max=M] | poisson:alpha=A[,max=M] | "
                "lognormal:average=A[,median_ratio=R][,max=M] | lognormal:mean=MU,sigma=S[,max=M] | N)");
  };
  LengthDist d;
  const size_t colon = text.find(':');
  d.distribution = text.substr(0, colon);
  std::map<std::string, double> params;
  if (colon == std::string::npos) {
    double v = 0;
    const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size() || text.empty()) fail("not a distribution");
    d.distribution = "constant";
    params["value"] = v;
  } else {
    std::stringstream rest(text.substr(colon + 1));
    for (std::string item; std::getline(rest, item, ',');) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos) fail("'" + item + "' is not KEY=NUMBER");
      double v = 0;
      const auto [p, ec] = std::from_chars(item.data() + eq + 1, item.data() + item.size(), v);
      if (ec != std::errc() || p != item.data() + item.size() || !std::isfinite(v)) fail("'" + item + "' is not KEY=NUMBER");
      if (!params.emplace(item.substr(0, eq), v).second) fail("'" + item.substr(0, eq) + "' given twice");
    }
  }
  static const std::map<std::string, std::set<std::string>> kKeys = {
      {"uniform", {"min", "max"}},       {"constant", {"value"}},
      {"zipf", {"alpha", "max"}},        {"poisson", {"alpha", "max"}},
      {"lognormal", {"average", "median_ratio", "mean", "sigma", "max"}}};
  const auto keys = kKeys.find(d.distribution);
  if (keys == kKeys.end()) fail("unknown distribution '" + d.distribution + "'");
  for (const auto& [k, v] : params) {
    if (!keys->second.count(k)) fail("'" + k + "' is not a parameter of " + d.distribution);
  }
  const auto need = [&](const char* k) {
    if (!params.count(k)) fail(d.distribution + " needs " + k);
    return params[k];
  };
  const auto whole = [&](const char* k, double v, double lo) {
    if (std::floor(v) != v || v < lo || v > kLargest) fail(std::string(k) + " must be an integer >= " + number(lo));
    return v;
  };
  if (params.count("max")) d.max = whole("max", params["max"], d.distribution == "uniform" ? 0 : 1);
  if (d.distribution == "constant") {
    d.value = whole("value", need("value"), 0);
  } else if (d.distribution == "uniform") {
    d.min = whole("min", need("min"), 0);
    need("max");
    if (d.min > *d.max) fail("min must be <= max");
  } else if (d.distribution == "zipf") {
    d.alpha = need("alpha");
    if (!(d.alpha > 1.0)) fail("zipf's alpha must be > 1");
  } else if (d.distribution == "poisson") {
    d.alpha = need("alpha");
    if (!(d.alpha > 0.0) || d.alpha > 1e9) fail("poisson's alpha (its mean) must be in (0, 1e9]");
  } else if (params.count("average")) {
    if (params.count("mean") || params.count("sigma")) fail("lognormal takes average or mean and sigma, not both");
    d.by_average = true;
    d.average = params["average"];
    if (!(d.average >= 1.0)) fail("lognormal's average must be >= 1");
    d.median_ratio = params.count("median_ratio") ? params["median_ratio"] : 0.85;
    if (!(d.median_ratio > 0.0 && d.median_ratio < 1.0)) fail("median_ratio must be in (0, 1)");
  } else {
    if (params.count("median_ratio")) fail("median_ratio goes with average");
    d.mean = need("mean");
    d.sigma = need("sigma");
    if (!(d.mean > 0.0) || !(d.sigma >= 0.0) || d.mean > 40.0) fail("lognormal needs 0 < mean <= 40 and sigma >= 0");
  }
  return d;
}

}  // namespace servetune::datasets
