// Whole-vector float math for host-side code (the sampler's softmax over the vocabulary, KV-cache row conversion),
// dispatched to the AVX-512 / AVX2 kernels the activations use, with a plain fallback.
#pragma once

#include <cstdint>
#include <span>

namespace servetune::cpu {

// The largest element of a non-empty `x`.
float max_value(std::span<const float> x);

// out[i] = e^((x[i] - shift) * scale); returns the sum of out. `out` has x.size() elements.
double exp_scaled(std::span<const float> x, float shift, float scale, std::span<float> out);

// The index std::max_element(x) returns (the first of the largest values) of a non-empty `x`.
int64_t argmax_first(std::span<const float> x);

// out[i] = e^((x[i] - shift) * scale), as exp_scaled computes them, and sums[b] = lane_block_sum (lane_sums.h) of
// out's block b of kSumBlock elements. `out` has x.size() elements, `sums` one per block (the last may be short).
void exp_scaled_blocks(std::span<const float> x, float shift, float scale, std::span<float> out,
                       std::span<double> sums);

// The indices i, in order, with w[i] >= theta and x[i] >= floor (w and x of one size), into ids (room for all);
// returns how many, and in *mass an estimate of their weights' sum (float sums of blocks, added in double).
size_t collect_at_least(std::span<const float> w, std::span<const float> x, float theta, float floor, int32_t* ids,
                        double* mass);

// out[i] = x[i] as IEEE half, rounded to nearest even (as f32_to_fp16 in core/half.h).
void to_f16(std::span<const float> x, uint16_t* out);

// out[i] = x[i] as FP8 E4M3, rounded to nearest even and saturating at ±448 (as f32_to_fp8_e4m3 in core/half.h).
void to_fp8_e4m3(std::span<const float> x, uint8_t* out);

}  // namespace servetune::cpu
