// The two-sample chi-square check of the speculative-decoding tests: counts of two samples per cell (cells with fewer
// than 20 observations in all pooled into one), the statistic, its degrees of freedom and the critical value at
// p = 1e-6 (Wilson-Hilferty). Test-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <utility>

namespace servetune::testing {

struct ChiSquare {
  double stat = 0.0;
  double critical = 0.0;
  int df = -1;
};

template <class Key>
ChiSquare two_sample_chi_square(const std::map<Key, std::pair<int64_t, int64_t>>& cells) {
  ChiSquare out;
  int64_t pool_a = 0, pool_b = 0;
  for (const auto& [key, ab] : cells) {
    if (ab.first + ab.second < 20) {
      pool_a += ab.first;
      pool_b += ab.second;
      continue;
    }
    const double d = static_cast<double>(ab.first - ab.second);
    out.stat += d * d / static_cast<double>(ab.first + ab.second);
    ++out.df;
  }
  if (pool_a + pool_b > 0) {
    const double d = static_cast<double>(pool_a - pool_b);
    out.stat += d * d / static_cast<double>(pool_a + pool_b);
    ++out.df;
  }
  if (out.df > 0) {
    const double k = 2.0 / (9.0 * out.df);
    out.critical = out.df * std::pow(1.0 - k + 4.753 * std::sqrt(k), 3.0);
  }
  return out;
}

}  // namespace servetune::testing
