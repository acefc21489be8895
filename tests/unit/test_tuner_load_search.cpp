// SLA search's bracketing and bisection against a known threshold: concurrency levels (integers) end adjacent, rates
// within 5%, a lo that already fails gives no level, a hi that holds ends there, the step budget stops it.
#include <gtest/gtest.h>

#include <vector>

#include "tuner/load_search.h"

namespace servetune::tuner {
namespace {

// Runs the search with "holds" meaning level <= threshold; returns the levels it measured.
std::vector<double> run(LoadSearch& s, double threshold) {
  std::vector<double> asked;
  while (const auto level = s.next()) {
    asked.push_back(*level);
    s.record(*level, *level <= threshold);
  }
  return asked;
}

TEST(TunerLoadSearch, ConcurrencyEndsAtTheThreshold) {
  LoadSearch s(1, 128, 20, true);
  const auto asked = run(s, 37);
  EXPECT_EQ(asked, (std::vector<double>{1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37}));
  ASSERT_TRUE(s.best());
  EXPECT_EQ(*s.best(), 37);
}

TEST(TunerLoadSearch, RatesEndWithinFivePercent) {
  LoadSearch s(0.5, 64, 30, false);
  run(s, 10.3);
  ASSERT_TRUE(s.best());
  EXPECT_LE(*s.best(), 10.3);
  EXPECT_GE(*s.best(), 10.3 / 1.05 - 1e-9);
}

TEST(TunerLoadSearch, EndsOfTheRangeAndTheStepBudget) {
  LoadSearch fails(4, 64, 10, true);
  EXPECT_EQ(run(fails, 2), (std::vector<double>{4}));
  EXPECT_FALSE(fails.best());
  LoadSearch holds(4, 20, 10, true);
  EXPECT_EQ(run(holds, 1000), (std::vector<double>{4, 8, 16, 20}));
  EXPECT_EQ(*holds.best(), 20);
  LoadSearch short_budget(1, 128, 3, true);
  EXPECT_EQ(run(short_budget, 37), (std::vector<double>{1, 2, 4}));
  EXPECT_EQ(*short_budget.best(), 4);
}

}  // namespace
}  // namespace servetune::tuner
