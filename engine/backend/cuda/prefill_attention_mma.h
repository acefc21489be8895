// Tensor-core (mma.sync) paged attention for prefill-sized batches (prefill_attention_mma.cu): when it applies, the
// device plan scratch it needs, and its launcher. The HIP build has no NVIDIA mma: it never applies there.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/gpu_shim.h"

namespace servetune::gpu {

// Batches below this many tokens keep the CUDA-core kernels (decode steps, short prompts).
constexpr int64_t kPrefillMmaMinTokens = 64;

// Whether launch_prefill_attention_mma takes this call: f16 or bf16 K/V, head_dim 64 or 128, at most 64 query heads
// per KV head, no draft-tree mask, at least kPrefillMmaMinTokens tokens, 16-byte aligned caches and 8-byte aligned q
// and out (null q / out: not checked). Always false in the HIP build.
bool prefill_attention_mma_applies(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads, const float* q,
                                   const float* out);
// Bytes of device scratch the tile plan of an n_tokens batch needs.
size_t prefill_attention_mma_plan_bytes(int64_t n_tokens);
// Backend::attention's result (within f16/bf16 rounding of Q and P) on tensor cores; `plan` is device scratch of
// prefill_attention_mma_plan_bytes. Only where prefill_attention_mma_applies.
void launch_prefill_attention_mma(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                                  float scale, void* plan, float* out, cudaStream_t stream);

}  // namespace servetune::gpu
