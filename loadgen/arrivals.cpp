// Request arrival process (see client.h arrival_times).
#include <cmath>

#include "datasets/rng.h"
#include "loadgen/client.h"
#include "servetune/error.h"

namespace servetune::loadgen {

std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed) {
  if (!(rate > 0.0)) throw_usage("--request-rate must be > 0 (or inf)");
  if (!(burstiness > 0.0)) throw_usage("--burstiness must be > 0");
  std::vector<double> t(n, 0.0);
  if (std::isinf(rate) || n == 0) return t;
  datasets::Rng rng(seed);
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += std::isinf(burstiness) ? 1.0 / rate : rng.gamma(burstiness, 1.0 / (rate * burstiness));
    t[i] = acc;
  }
  if (t.back() > 0.0) {
    const double factor = (static_cast<double>(n) / rate) / t.back();
    for (double& x : t) x *= factor;
  }
  return t;
}

}  // namespace servetune::loadgen
