// SIMD attention for f32, f16 and FP8 E4M3 paged KV caches (runtime-dispatched; same math as ops_reference.h's attention_head up to
// float summation order). One call handles any range of one token's query heads and reads their KV heads' K columns
// (kv_layout.h: keys as vector lanes) and the stretch of each V row that holds them once for all of them; a head's
// result does not depend on the range it was computed in.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace servetune::cpu::detail {

// The most tokens one kernel call takes.
constexpr int64_t kMaxRunTokens = 16;

// Heads [head_begin, head_begin + head_count) of tokens [t0, t1): consecutive tokens of one sequence, at most
// kMaxRunTokens (any positions, draft-tree tokens too). `out` is the batch's output ([n_tokens, n_heads, head_dim]);
// `scratch` holds attention_scratch_floats((t1 - t0) * head_count, n_ctx) floats, n_ctx the most any of them scans.
// Requires kv.dtype f32, f16, bf16 or FP8 E4M3 and attention_simd_supports(head_dim) for the ISA.
using AttentionGroupKernel = void (*)(const KvLayerView& kv, const AttentionBatch& batch, const float* q,
                                      int64_t n_heads, float scale, int64_t t0, int64_t t1, int64_t head_begin,
                                      int64_t head_count, float* scratch, float* out);

void attention_group_avx512(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                            float scale, int64_t t0, int64_t t1, int64_t head_begin, int64_t head_count,
                            float* scratch, float* out);
void attention_group_avx2(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                          float scale, int64_t t0, int64_t t1, int64_t head_begin, int64_t head_count,
                          float* scratch, float* out);

// Head dims the kernels are instantiated for: a multiple of the vector width, at most 8 vectors, or 16 vectors.
inline bool attention_simd_supports(int64_t head_dim, int64_t vector_width) {
  const int64_t nv = head_dim / vector_width;
  return head_dim % vector_width == 0 && ((nv >= 1 && nv <= 8) || nv == 16);
}
inline int64_t attention_scratch_floats(int64_t head_count, int64_t n_ctx) { return head_count * (n_ctx + 16); }

}  // namespace servetune::cpu::detail
