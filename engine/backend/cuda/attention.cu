// Paged attention for flattened varlen batches (prefill and decode alike): one block per (token, query head), or per
// (token, group of query heads sharing a KV head) when there are enough of those; each warp walks a strided share of
// the token's visible positions through the block table with an online softmax, and the warps' partial results are
// merged at the end. GQA maps query head h to KV head h / (n_heads / n_kv_heads). K/V are f32, f16 or bf16. Batches too
// small to fill the GPU with long contexts go to the split kernel instead (decode_attention_split.cu). Draft-tree tokens
// (tree_mask.h) scan their span and skip the keys their mask hides.
#include <cstdint>

#include "backend/cuda/elem.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tree_mask.h"
#include "core/error.h"

namespace servetune::gpu {
namespace {

constexpr int kMaxHeadDim = 256;
// Query heads one block serves from each K/V row it loads: 8, fewer for wide heads, so that a thread's q and
// accumulator rows (2 * group * values per lane) stay at 64 registers at most (head_dim 256 with 8 would need 128
// and spill to local memory).
constexpr int group_for(int per_lane) { return per_lane <= 4 ? 8 : 32 / per_lane; }
constexpr int64_t kManyBlocks = 256;   // below this many (token, KV head) pairs, one block per query head keeps SMs busy

// One block per (token, group of up to kGroup query heads sharing a KV head); kWarps warps split the positions.
template <int kPerLane, int kGroup, int kWarps>
__global__ void attention_kernel(const void* k_cache, const void* v_cache, int code, int64_t page_size, int64_t n_kv_heads,
                                 int64_t head_dim, const int32_t* positions, const int32_t* seq_of_token,
                                 const int32_t* block_tables, int64_t max_blocks, TreeMasks tree, const float* q,
                                 int64_t n_heads, int64_t heads_per_block, float scale, float* out) {
  __shared__ float sm_m[kWarps][kGroup], sm_l[kWarps][kGroup];
  __shared__ float sm_acc[kWarps][kGroup][kPerLane * kWarpSize];
  const int64_t blocks_per_token = n_heads / heads_per_block;
  const int64_t t = blockIdx.x / blocks_per_token, h0 = (blockIdx.x % blocks_per_token) * heads_per_block;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t kv_head = h0 / (n_heads / n_kv_heads);
  const int64_t width = n_kv_heads * head_dim;
  const TreeView view = tree_view(tree, t);
  const int64_t n_ctx = view.span(positions[t]);
  const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
  const int group = static_cast<int>(heads_per_block);

  float qv[kGroup][kPerLane], acc[kGroup][kPerLane], m[kGroup], l[kGroup];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + i * kWarpSize;
      qv[g][i] = (g < group && d < head_dim) ? q[(t * n_heads + h0 + g) * head_dim + d] : 0.0f;
      acc[g][i] = 0.0f;
    }
  }
  for (int64_t j = warp; j < n_ctx; j += kWarps) {
    if (!view.sees(j)) continue;  // uniform across the warp (a masked key contributes nothing; m stays -inf before any)
    const int64_t slot = static_cast<int64_t>(table[j / page_size]) * page_size + j % page_size;
    const int64_t base = slot * width + kv_head * head_dim;
    float kr[kPerLane], vr[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + i * kWarpSize;
      kr[i] = vr[i] = 0.0f;
      if (d < head_dim) {
        kr[i] = load_elem(k_cache, base + d, code);
        vr[i] = load_elem(v_cache, base + d, code);
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (g < group) {  // uniform across the block
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) dot += qv[g][i] * kr[i];
        const float score = warp_sum(dot) * scale;
        const float m_new = fmaxf(m[g], score);
        const float correction = expf(m[g] - m_new);
        const float p = expf(score - m_new);
        l[g] = l[g] * correction + p;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[g][i] = acc[g][i] * correction + p * vr[i];
        m[g] = m_new;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) sm_acc[warp][g][lane + i * kWarpSize] = acc[g][i];
  }
  __syncthreads();

  // Merge the warps' partial softmaxes (a warp that saw no position has l = 0).
  for (int64_t e = threadIdx.x; e < group * head_dim; e += blockDim.x) {
    const int64_t g = e / head_dim, d = e % head_dim;
    float m_all = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, sm_m[w][g]);
    float l_all = 0.0f, sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (sm_l[w][g] <= 0.0f) continue;
      const float f = expf(sm_m[w][g] - m_all);
      l_all += sm_l[w][g] * f;
      sum += sm_acc[w][g][d] * f;
    }
    out[(t * n_heads + h0 + g) * head_dim + d] = sum / l_all;
  }
}

template <int kPerLane>
void launch_with(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, float scale, float* out,
                 cudaStream_t stream) {
  const int64_t group_size = n_heads / kv.n_kv_heads;
  // Grouped blocks read each K/V row once for up to kGroup query heads; with few (token, KV head) pairs (small
  // decode batches) one block per query head with more warps keeps more of the GPU busy.
  const bool grouped = group_size > 1 && b.n_tokens * kv.n_kv_heads >= kManyBlocks;
  int64_t per_block = 1;
  constexpr int kGroup = group_for(kPerLane);
  if (grouped) {
    per_block = kGroup;
    while (group_size % per_block != 0) --per_block;  // a divisor of the group, so blocks never straddle KV heads
  }
  const auto blocks = static_cast<unsigned>(b.n_tokens * (n_heads / per_block));
  if (per_block > 1) {
    attention_kernel<kPerLane, kGroup, 4><<<blocks, 4 * kWarpSize, 0, stream>>>(
        kv.k, kv.v, elem_code(kv.dtype), kv.page_size, kv.n_kv_heads, kv.head_dim, b.positions, b.seq_of_token,
        b.block_tables, b.max_blocks_per_seq, tree_masks(b), q, n_heads, per_block, scale, out);
  } else {
    attention_kernel<kPerLane, 1, 8><<<blocks, 8 * kWarpSize, 0, stream>>>(
        kv.k, kv.v, elem_code(kv.dtype), kv.page_size, kv.n_kv_heads, kv.head_dim, b.positions, b.seq_of_token,
        b.block_tables, b.max_blocks_per_seq, tree_masks(b), q, n_heads, 1, scale, out);
  }
  check(cudaGetLastError(), "attention kernel");
}

}  // namespace

void launch_attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                      float* out, cudaStream_t stream) {
  if (batch.n_tokens == 0) return;
  if (kv.head_dim > kMaxHeadDim) {
    throw_unsupported("head_dim " + std::to_string(kv.head_dim) + " exceeds the GPU attention kernel's limit (" +
                      std::to_string(kMaxHeadDim) + ")");
  }
  const int64_t per_lane = (kv.head_dim + kWarpSize - 1) / kWarpSize;
  if (per_lane <= 1) launch_with<1>(kv, batch, q, n_heads, scale, out, stream);
  else if (per_lane <= 2) launch_with<2>(kv, batch, q, n_heads, scale, out, stream);
  else if (per_lane <= 4) launch_with<4>(kv, batch, q, n_heads, scale, out, stream);
  else launch_with<kMaxHeadDim / kWarpSize>(kv, batch, q, n_heads, scale, out, stream);
}

}  // namespace servetune::gpu
