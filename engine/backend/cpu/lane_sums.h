// The sampler's fixed-order double sums of float weights, shared by every ISA's kernels and the plain fallback so
// that all of them add in the same order. Internal linkage: safe to include from any ISA's file.
#pragma once

#include <cstdint>

namespace servetune::cpu {

// Weights are summed in blocks of this many; a draw walks the block sums, then the weights of one block.
constexpr int64_t kSumBlock = 256;

constexpr int kSumLanes = 16;

// Lanes l and l + 8, l and l + 4, l and l + 2, l and l + 1 added pairwise; returns the total.
static inline double lane_tree_sum(double (&lane)[kSumLanes]) {
  for (int half = kSumLanes / 2; half >= 1; half /= 2) {
    for (int l = 0; l < half; ++l) lane[l] += lane[l + half];
  }
  return lane[0];
}

// The sum of w[0, len) in double: element i goes to lane i % 16, each lane summed in element order, then
// lane_tree_sum. The vector kernels (exp_scaled_blocks) add in exactly this order.
static inline double lane_block_sum(const float* w, int64_t len) {
  double lane[kSumLanes] = {};
  for (int64_t i = 0; i < len; ++i) lane[i % kSumLanes] += static_cast<double>(w[i]);
  return lane_tree_sum(lane);
}

}  // namespace servetune::cpu
