// SIMD versions of the reference attention for f32 KV caches (runtime-dispatched; same math as
// ops_reference.h's attention_head up to float summation order).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace servetune::cpu::detail {

// Requires kv.dtype == f32 and kv.head_dim % 16 == 0 (AVX-512) or % 8 == 0 (AVX2).
void attention_head_f32_avx512(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                               float scale, int64_t t, int64_t h, float* scratch, float* out);
void attention_head_f32_avx2(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                             float scale, int64_t t, int64_t h, float* scratch, float* out);

}  // namespace servetune::cpu::detail
