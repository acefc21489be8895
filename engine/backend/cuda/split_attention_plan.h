// Flash-decoding's host plan (how many chunks of whole KV pages each token's positions split into) and the softmax
// merge both of its kernels use; plain functions, compiled by the CPU build too so that a CPU test checks them.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SERVETUNE_HD __host__ __device__
#else
#define SERVETUNE_HD
#endif

namespace servetune::gpu {

// Chunks (but a token's last) are at least this many positions: shorter ones would spend more on writing and merging
// partials than they save by spreading the reads.
constexpr int64_t kMinChunkPositions = 128;
// Blocks per SM the split aims for: several resident blocks per SM keep enough loads in flight to saturate memory.
constexpr int64_t kSplitBlocksPerSm = 4;

// Token t's visible positions [0, n_ctx) split into chunks of chunk_pages whole pages; chunk c covers
// [c * chunk_len, (c + 1) * chunk_len) clipped to n_ctx, and the last used chunk also takes any positions past
// n_chunks chunks, so every position is in exactly one chunk and no used chunk is empty. n_chunks == 1: single pass.
struct SplitPlan {
  int64_t n_chunks = 1;     // chunks (grid blocks) per (token, head block): the most any token of the batch uses
  int64_t chunk_pages = 0;  // pages per chunk (0 with a single pass)
  int64_t page_size = 1;

  SERVETUNE_HD int64_t chunk_len() const { return chunk_pages * page_size; }
  // Chunks token t uses, its context being n_ctx >= 1 positions: those that hold at least one of its positions.
  SERVETUNE_HD int64_t chunks_used(int64_t n_ctx) const {
    if (n_chunks <= 1) return 1;
    const int64_t used = (n_ctx + chunk_len() - 1) / chunk_len();
    return used < n_chunks ? used : n_chunks;
  }
  SERVETUNE_HD int64_t chunk_begin(int64_t c) const { return n_chunks <= 1 ? 0 : c * chunk_len(); }
  SERVETUNE_HD int64_t chunk_end(int64_t c, int64_t n_ctx) const {
    if (c + 1 >= chunks_used(n_ctx)) return n_ctx;
    return (c + 1) * chunk_len();
  }
};

// The plan for a batch: `units` blocks would run per chunk (tokens x head blocks), the longest context is at most
// max_pages pages of page_size. Splits only when a single pass leaves the GPU short of blocks (fewer than half of
// kSplitBlocksPerSm per SM) and the longest context holds two chunks of kMinChunkPositions.
inline SplitPlan plan_split_attention(int64_t units, int64_t max_pages, int64_t page_size, int64_t sm_count) {
  SplitPlan single;
  single.page_size = page_size;
  if (units <= 0 || max_pages <= 0 || page_size <= 0 || sm_count <= 0) return single;
  const int64_t want = sm_count * kSplitBlocksPerSm / units;  // chunks per token that fill the GPU, not more
  const int64_t min_pages = (kMinChunkPositions + page_size - 1) / page_size;
  if (want < 2 || max_pages < 2 * min_pages) return single;
  int64_t chunk_pages = (max_pages + want - 1) / want;
  if (chunk_pages < min_pages) chunk_pages = min_pages;
  const int64_t n_chunks = (max_pages + chunk_pages - 1) / chunk_pages;
  if (n_chunks < 2) return single;
  return SplitPlan{n_chunks, chunk_pages, page_size};
}

// Merging two partial softmaxes (running max m, sum l of exp(score - m), and acc = sum of exp(score - m) * v): the
// merged max, sum, and the factors that rescale each side's acc. A partial that saw nothing (m = -inf, l = 0) gets
// factor 0; two such give an empty partial, never NaN. One score s with value v is the partial (s, 1, v).
struct SoftmaxMerge {
  float m, l, fa, fb;
};
SERVETUNE_HD inline SoftmaxMerge softmax_merge(float m_a, float l_a, float m_b, float l_b) {
  const float m = fmaxf(m_a, m_b);
  if (m == -INFINITY) return {m, 0.0f, 0.0f, 0.0f};
  const float fa = expf(m_a - m), fb = expf(m_b - m);
  return {m, l_a * fa + l_b * fb, fa, fb};
}
// Merges the partial (m_b, l_b) with one acc element acc_b into the running partial (m, l) with element acc.
SERVETUNE_HD inline void softmax_merge_into(float& m, float& l, float& acc, float m_b, float l_b, float acc_b) {
  const SoftmaxMerge s = softmax_merge(m, l, m_b, l_b);
  acc = acc * s.fa + acc_b * s.fb;
  m = s.m;
  l = s.l;
}

}  // namespace servetune::gpu
