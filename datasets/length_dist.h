// Named integer distributions for synthetic multi-turn lengths (turns, input / output / prefix tokens), with the
// names and parameters of vLLM's benchmarks/multi_turn JSON config. Sampling uses Rng only: same seed, same draws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "datasets/rng.h"

namespace servetune::datasets {

struct LengthDist {
  // uniform {min, max} (integers, both inclusive) | constant {value} | zipf {alpha > 1, max} |
  // poisson {alpha = the mean, max} | lognormal {average, median_ratio (0.85)} or {mean, sigma} (of the underlying
  // normal), with max. max caps a draw (nullopt: no cap).
  std::string distribution = "constant";
  double min = 0, value = 0, alpha = 0, average = 0, median_ratio = 0.85, mean = 0, sigma = 0;
  std::optional<double> max;
  bool by_average = false;  // lognormal given as {average, median_ratio}

  // One draw, rounded to an integer and capped by max; never negative. constant draws no random numbers.
  int64_t sample(Rng& rng) const;
  // "zipf:alpha=2,max=20": the text parse_length_dist reads back.
  std::string text() const;
};

// Parses "NAME:KEY=VALUE,..." (e.g. "uniform:min=120,max=160", "lognormal:average=1000,max=5000") or a bare
// integer N (constant N). Throws Error(kUsage) naming `what` (a flag or sweep key; "": no name) for an unknown name, a
// missing, unknown or out-of-range parameter.
LengthDist parse_length_dist(const std::string& text, const std::string& what);

}  // namespace servetune::datasets
