// Intervals and Welch's test over repeats (see noise.h). The t distribution's CDF comes from the regularized
// incomplete beta function (continued fraction, modified Lentz); its quantile from bisection on the CDF.
#include "tuner/noise.h"

#include <cmath>
#include <limits>

namespace servetune::tuner {
namespace {

// The continued fraction of I_x(a, b), valid for x < (a + 1) / (a + b + 2).
double beta_fraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300;
  double c = 1.0;
  double d = 1.0 - (a + b) * x / (a + 1.0);
  d = 1.0 / (std::fabs(d) < kTiny ? kTiny : d);
  double h = d;
  for (int m = 1; m <= 300; ++m) {
    const double m2 = 2.0 * m;
    for (const double num : {m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
                             -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))}) {
      d = 1.0 + num * d;
      d = 1.0 / (std::fabs(d) < kTiny ? kTiny : d);
      c = 1.0 + num / c;
      if (std::fabs(c) < kTiny) c = kTiny;
      h *= d * c;
    }
    if (std::fabs(d * c - 1.0) < 1e-15) break;
  }
  return h;
}

double regularized_beta(double a, double b, double x) {
  if (x <= 0.0) return 0.0;
  if (x >= 1.0) return 1.0;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1.0) / (a + b + 2.0)) return front * beta_fraction(a, b, x) / a;
  return 1.0 - front * beta_fraction(b, a, 1.0 - x) / b;
}

double mean_of(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double variance_of(const std::vector<double>& v, double mean) {
  double s = 0.0;
  for (double x : v) s += (x - mean) * (x - mean);
  return s / static_cast<double>(v.size() - 1);
}

}  // namespace

double student_t_cdf(double t, double dof) {
  const double tail = 0.5 * regularized_beta(dof / 2.0, 0.5, dof / (dof + t * t));
  return t >= 0.0 ? 1.0 - tail : tail;
}

double student_t_quantile(double p, double dof) {
  if (p == 0.5) return 0.0;
  if (p < 0.5) return -student_t_quantile(1.0 - p, dof);
  double lo = 0.0, hi = 1.0;
  while (student_t_cdf(hi, dof) < p && hi < 1e12) hi *= 2.0;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, dof) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::optional<MeanInterval> mean_interval(const std::vector<double>& samples, double confidence) {
  if (samples.size() < 2) return std::nullopt;
  MeanInterval r;
  r.n = samples.size();
  r.mean = mean_of(samples);
  const double se = std::sqrt(variance_of(samples, r.mean) / static_cast<double>(r.n));
  const double half = student_t_quantile(0.5 + confidence / 2.0, static_cast<double>(r.n - 1)) * se;
  r.low = r.mean - half;
  r.high = r.mean + half;
  return r;
}

std::optional<double> noise_allowance(const std::vector<double>& baseline, size_t new_samples, double confidence) {
  if (baseline.size() < 2 || new_samples == 0) return std::nullopt;
  const double n = static_cast<double>(baseline.size());
  const double sd = std::sqrt(variance_of(baseline, mean_of(baseline)));
  return student_t_quantile(0.5 + confidence / 2.0, n - 1.0) * sd * std::sqrt(1.0 / n + 1.0 / static_cast<double>(new_samples));
}

std::optional<MeanDifference> compare_means(const std::vector<double>& a, const std::vector<double>& b, double confidence) {
  if (a.size() < 2 || b.size() < 2) return std::nullopt;
  const double ma = mean_of(a), mb = mean_of(b);
  if (ma == 0.0) return std::nullopt;
  const double va = variance_of(a, ma) / static_cast<double>(a.size());
  const double vb = variance_of(b, mb) / static_cast<double>(b.size());
  MeanDifference d;
  d.n_a = a.size();
  d.n_b = b.size();
  const double diff = mb - ma;
  d.change = diff / ma;
  const double se = std::sqrt(va + vb);
  if (se == 0.0) {  // no spread at all: any difference is exact
    d.low = d.high = d.change;
    d.p_value = diff == 0.0 ? 1.0 : 0.0;
    return d;
  }
  const double dof = (va + vb) * (va + vb) /
                     (va * va / static_cast<double>(a.size() - 1) + vb * vb / static_cast<double>(b.size() - 1));
  const double half = student_t_quantile(0.5 + confidence / 2.0, dof) * se;
  d.low = (diff - half) / std::fabs(ma);
  d.high = (diff + half) / std::fabs(ma);
  d.p_value = 2.0 * (1.0 - student_t_cdf(std::fabs(diff) / se, dof));
  return d;
}

}  // namespace servetune::tuner
