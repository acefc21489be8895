// The model-guided strategy (strategy: {kind: bayes, budget, startup, seed}): a tree-structured Parzen estimator
// over the enumerated space (see strategy_bayes.cpp).
#pragma once

#include <memory>

#include "tuner/strategy.h"

namespace servetune::tuner {

std::unique_ptr<Strategy> make_bayes_strategy(const SweepSpec& spec, const SearchSpace& space);

}  // namespace servetune::tuner
