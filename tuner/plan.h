// The resolved plan of a sweep, checked before anything runs (constraints that exclude every candidate are an
// error) and printed by `servetune sweep --dry-run`.
#pragma once

#include <cstdio>
#include <vector>

#include "tuner/space.h"
#include "tuner/sweep_spec.h"

namespace servetune::tuner {

// The candidates the first batch of the strategy considers (grid / halving: all; staged: the first stage).
std::vector<Candidate> first_candidates(const SweepSpec& spec, const SearchSpace& space);
// Throws Error(kUsage) naming the sweep file when every one of them is excluded.
void validate_plan(const SweepSpec& spec, const SearchSpace& space);

}  // namespace servetune::tuner
