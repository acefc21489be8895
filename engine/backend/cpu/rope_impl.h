// The rotary embedding written once over a vector-ISA traits type (S): included only by rope_avx512.cpp and
// rope_avx2.cpp, which are compiled with that ISA and without FMA contraction.
#pragma once

#include <cstdint>

#include "backend/cpu/ops_reference.h"

namespace servetune::cpu::detail::rope_impl {

constexpr int64_t kMaxRopeDim = 512;

// Interleaved pairs (x[2i], x[2i+1]) rotate as x[2i] * c - x[2i+1] * s and x[2i] * s + x[2i+1] * c: one vector of
// x times each pair's c twice, plus x with its pairs swapped times (-s, s). NeoX halves rotate x[i] with
// x[i + rope_dim / 2] and read c and s from per-pair tables. Same products and sums as the reference, so the
// same bits.
template <class S>
void rope_heads(float* x, int64_t n_heads, const float* cos_sin, const RopeParams& p) {
  constexpr int W = S::kWidth;
  const int64_t dim = p.rope_dim, half = dim / 2;
  if (dim > kMaxRopeDim || (p.neox ? half % W != 0 : dim % W != 0)) {
    ref::rope_heads(x, n_heads, cos_sin, p);
    return;
  }
  alignas(64) float cos_table[kMaxRopeDim];
  alignas(64) float sin_table[kMaxRopeDim];
  if (p.neox) {
    for (int64_t j = 0; j < half; ++j) cos_table[j] = cos_sin[2 * j], sin_table[j] = cos_sin[2 * j + 1];
  } else {
    for (int64_t i = 0; i < dim; i += 2) {
      cos_table[i] = cos_table[i + 1] = cos_sin[i];
      sin_table[i] = -cos_sin[i + 1];
      sin_table[i + 1] = cos_sin[i + 1];
    }
  }
  for (float* head = x; head < x + n_heads * p.head_dim; head += p.head_dim) {
    if (p.neox) {
      for (int64_t j = 0; j < half; j += W) {
        const auto x0 = S::load(head + j), x1 = S::load(head + j + half);
        const auto c = S::load(cos_table + j), s = S::load(sin_table + j);
        S::store(head + j, S::sub(S::mul(x0, c), S::mul(x1, s)));
        S::store(head + j + half, S::add(S::mul(x0, s), S::mul(x1, c)));
      }
    } else {
      for (int64_t i = 0; i < dim; i += W) {
        const auto v = S::load(head + i);
        S::store(head + i, S::add(S::mul(v, S::load(cos_table + i)), S::mul(S::swap_pairs(v), S::load(sin_table + i))));
      }
    }
  }
}

}  // namespace servetune::cpu::detail::rope_impl
