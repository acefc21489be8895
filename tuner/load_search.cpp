// Bracketing + bisection over a load level (see load_search.h).
#include "tuner/load_search.h"

#include <algorithm>
#include <cmath>

#include "servetune/error.h"

namespace servetune::tuner {

LoadSearch::LoadSearch(double lo, double hi, int max_steps, bool integer)
    : lo_(lo), hi_(hi), max_steps_(max_steps), integer_(integer) {
  if (!(lo > 0.0) || !(hi >= lo) || max_steps < 1) {
    throw Error(ErrorKind::kInternal, "load search needs 0 < lo <= hi and at least one step");
  }
}

std::optional<double> LoadSearch::next() const {
  if (steps_ >= max_steps_) return std::nullopt;
  if (!pass_ && !fail_) return lo_;
  if (!pass_) return std::nullopt;  // lo already fails
  if (!fail_) {                      // bracketing: double until a level fails or hi held
    if (*pass_ >= hi_) return std::nullopt;
    return std::min(hi_, integer_ ? std::floor(*pass_ * 2.0) : *pass_ * 2.0);
  }
  const double a = *pass_, b = *fail_;
  if (integer_ ? b - a <= 1.0 : b - a <= 0.05 * a) return std::nullopt;
  return integer_ ? std::floor((a + b) / 2.0) : (a + b) / 2.0;
}

void LoadSearch::record(double level, bool holds) {
  ++steps_;
  if (holds) pass_ = pass_ ? std::max(*pass_, level) : level;
  else fail_ = fail_ ? std::min(*fail_, level) : level;
}

}  // namespace servetune::tuner
