// SLA search: the highest load (request rate or concurrency) at which a candidate's SLOs hold, found by bracketing
// and bisection as `vllm bench sweep serve_sla` does. Pure arithmetic over pass/fail answers; the trial runner
// measures each level it asks for.
#pragma once

#include <optional>
#include <vector>

namespace servetune::tuner {

class LoadSearch {
 public:
  // Levels in [lo, hi] (0 < lo <= hi), at most max_steps measurements; `integer`: concurrency levels.
  LoadSearch(double lo, double hi, int max_steps, bool integer);

  // The next level to measure, or nullopt when the search is over: lo first; while levels hold, double (up to hi);
  // after the first failure, bisect between the highest level that held and the lowest that failed until they are
  // adjacent (integers) or within 5% of each other (rates), or the steps run out.
  std::optional<double> next() const;
  // The answer for `level` (the one next() gave).
  void record(double level, bool holds);
  // The highest level that held; nullopt when none did (the candidate cannot meet its SLOs even at lo).
  std::optional<double> best() const { return pass_; }
  int steps() const { return steps_; }

 private:
  double lo_, hi_;
  int max_steps_, steps_ = 0;
  bool integer_;
  std::optional<double> pass_, fail_;  // highest level that held, lowest that failed
};

}  // namespace servetune::tuner
