// Top token and KL divergence of scored positions (see position_logprobs.h).
#include "loadgen/position_logprobs.h"

#include <algorithm>
#include <cmath>

namespace servetune::loadgen {
namespace {

// A rest outcome the run gives no mass while the base gives it some would make the KL infinite; the run's known
// values are f32 and their sum is off by ~1e-7, so its rest is floored well below that instead.
constexpr double kRestFloor = 1e-10;

// Calls f(base logprob, run logprob) for every token both report.
template <class F>
void for_shared(const PositionLogprobs& base, const PositionLogprobs& run, F&& f) {
  if (base.is_dense()) {
    for (const TokenLogprob& t : run.sparse) {
      if (t.token >= 0 && static_cast<size_t>(t.token) < base.dense.size()) f(base.dense[static_cast<size_t>(t.token)], t.logprob);
    }
    return;
  }
  if (run.is_dense()) {
    for (const TokenLogprob& t : base.sparse) {
      if (t.token >= 0 && static_cast<size_t>(t.token) < run.dense.size()) f(t.logprob, run.dense[static_cast<size_t>(t.token)]);
    }
    return;
  }
  auto b = base.sparse.begin();
  auto r = run.sparse.begin();
  while (b != base.sparse.end() && r != run.sparse.end()) {
    if (b->token < r->token) {
      ++b;
    } else if (r->token < b->token) {
      ++r;
    } else {
      f(b->logprob, r->logprob);
      ++b;
      ++r;
    }
  }
}

}  // namespace

int32_t PositionLogprobs::top_token() const {
  if (is_dense()) return static_cast<int32_t>(std::max_element(dense.begin(), dense.end()) - dense.begin());
  if (sparse.empty()) return target;
  const auto best = std::max_element(sparse.begin(), sparse.end(),
                                     [](const TokenLogprob& a, const TokenLogprob& b) { return a.logprob < b.logprob; });
  return best->token;
}

double kl_divergence(const PositionLogprobs& base, const PositionLogprobs& run) {
  double kl = 0.0;
  if (base.is_dense() && run.is_dense()) {
    const size_t n = std::min(base.dense.size(), run.dense.size());
    for (size_t t = 0; t < n; ++t) {
      const double b = base.dense[t];
      kl += std::exp(b) * (b - static_cast<double>(run.dense[t]));
    }
    return std::max(0.0, kl);
  }
  double base_mass = 0.0, run_mass = 0.0;
  for_shared(base, run, [&](double b, double r) {
    const double p = std::exp(b);
    kl += p * (b - r);
    base_mass += p;
    run_mass += std::exp(r);
  });
  const double base_rest = 1.0 - base_mass;
  if (base_rest > 0.0) kl += base_rest * std::log(base_rest / std::max(1.0 - run_mass, kRestFloor));
  return std::max(0.0, kl);
}

}  // namespace servetune::loadgen
