// Absorbed latent attention (MLA) for a run of tokens and a range of their heads, built per ISA (latent_attention_impl.h).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace servetune::cpu {

struct LatentAttentionItem {
  const KvLayerView* kv = nullptr;
  const AttentionBatch* batch = nullptr;
  const float* q = nullptr;  // [n_tokens, n_heads, kv.head_dim]
  int64_t n_heads = 0;
  int64_t v_dim = 0;
  float scale = 1.0f;
  float* out = nullptr;      // [n_tokens, n_heads, v_dim]
};

// Per-thread buffers: a widened cache row (the SIMD kernels: one per position of a block), the queries (the SIMD
// kernels: transposed, lanes side by side), the scores (then weights), their sums and the output sums.
struct LatentAttentionScratch {
  std::vector<float> row, queries, scores, sum, acc;
  std::vector<std::vector<float>> rows;
};

// Tokens [t0, t1) (one sequence, consecutive positions), heads [h0, h1): out = softmax(q . row * scale) weighted
// sum of the rows' first v_dim values.
using LatentAttentionKernel = void (*)(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                                       LatentAttentionScratch& scratch);

// Long contexts are split into blocks of kLatentPositionBlock positions ([b * block, (b + 1) * block)), each
// block's part computed on its own and the parts merged in block order (flash-decoding), so one sequence's decode
// spreads over threads. The blocks are fixed by position, not by thread count, so results do not depend on either.
constexpr int64_t kLatentPositionBlock = 512;
// One block's part for each (token, head) lane of the item, token-major: kLatentPartialHeader values (the block's
// largest score, or -inf when the lane sees none of it; the sum of e^((score - max) * scale)) then v_dim unnormalised
// output sums.
constexpr int64_t kLatentPartialHeader = 2;
using LatentPartialKernel = void (*)(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                                     int64_t block, float* partial, LatentAttentionScratch& scratch);

namespace detail {
void latent_attention_reference(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                                LatentAttentionScratch& scratch);
void latent_attention_avx2(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                           LatentAttentionScratch& scratch);
void latent_attention_avx512(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                             LatentAttentionScratch& scratch);
void latent_partial_avx2(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1, int64_t block,
                         float* partial, LatentAttentionScratch& scratch);
void latent_partial_avx512(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1, int64_t block,
                           float* partial, LatentAttentionScratch& scratch);
// out for the lanes of tokens [t0, t1), heads [h0, h1) from their `blocks` partials (consecutive, block order).
void latent_merge(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1, const float* partials,
                  int64_t blocks);
}  // namespace detail

}  // namespace servetune::cpu
