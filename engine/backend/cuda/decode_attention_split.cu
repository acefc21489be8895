// Flash-decoding: paged attention split over each token's positions in chunks of whole pages (split_attention_plan.h);
// one block per (token, query heads sharing a KV head, chunk) writes partial softmaxes to scratch, a second kernel
// merges them per (token, head). 16-byte K/V loads shared by the block's query heads; head_dim 64, 128 or 256. Draft-tree
// tokens (tree_mask.h) split their span and skip the keys their mask hides.
#include <cstdint>

#include "backend/cuda/elem.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tree_mask.h"
#include "core/error.h"

namespace servetune::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 2;  // keys a row slot loads per step
constexpr int64_t kMaxGroup = 8;  // query heads per block; 8 keeps q and acc at 128 registers a thread

// Query heads a block serves: the largest divisor of the GQA group up to kMaxGroup, so blocks never straddle KV heads.
int64_t heads_per_block(int64_t group_size) {
  int64_t per = group_size < kMaxGroup ? group_size : kMaxGroup;
  while (group_size % per != 0) --per;
  return per;
}

// kVec consecutive cache elements from one 16-byte load, as floats (little-endian: the lower half is the first).
template <int kCode>
struct KvVec {
  static constexpr int kBytes = kCode == kElemF32 ? 4 : kCode == kElemFp8 ? 1 : 2;
  static constexpr int kVec = 16 / kBytes;
  __device__ static void load(const void* base, int64_t index, float* out) {
    const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const char*>(base) + index * kBytes);
    const unsigned words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kCode == kElemF32) {
        out[i] = __uint_as_float(words[i]);
      } else if constexpr (kCode == kElemFp8) {
#pragma unroll
        for (int j = 0; j < 4; ++j) out[4 * i + j] = fp8_e4m3_bits_to_f32(static_cast<unsigned char>(words[i] >> (8 * j)));
      } else if constexpr (kCode == kElemF16) {
        out[2 * i] = fp16_bits_to_f32(static_cast<unsigned short>(words[i] & 0xFFFFu));
        out[2 * i + 1] = fp16_bits_to_f32(static_cast<unsigned short>(words[i] >> 16));
      } else {
        out[2 * i] = bf16_bits_to_f32(static_cast<unsigned short>(words[i] & 0xFFFFu));
        out[2 * i + 1] = bf16_bits_to_f32(static_cast<unsigned short>(words[i] >> 16));
      }
    }
  }
};

// A KV row's head_dim elements are read by kLanesPerRow lanes, kVecsPerLane 16-byte vectors each, so a warp reads
// kRowsPerWarp rows (positions) at once and the block kRowSlots; each row slot keeps its own online softmax over the
// positions begin + slot, + kRowSlots, ..., and the slots' partials are merged (shuffles in a warp, then shared
// memory across warps) into the chunk's partial. Block (blockIdx.x): chunk fastest, then head block, then token.
template <int kCode, int kHeadDim, int kGroup>
__global__ void __launch_bounds__(kWarps * kWarpSize)
    split_attention_kernel(const void* __restrict__ k_cache, const void* __restrict__ v_cache, int page_size,
                           int64_t n_kv_heads, const int32_t* positions, const int32_t* seq_of_token,
                           const int32_t* block_tables, int64_t max_blocks, TreeMasks tree, const float* q,
                           int64_t n_heads, int group, float scale, SplitPlan plan, float* part_ml, float* part_acc) {
  constexpr int kVec = KvVec<kCode>::kVec;
  constexpr int kLanesPerRow = kHeadDim / kVec < kWarpSize ? kHeadDim / kVec : kWarpSize;
  constexpr int kVecsPerLane = kHeadDim / (kVec * kLanesPerRow);
  constexpr int kElems = kVecsPerLane * kVec;
  constexpr int kRowsPerWarp = kWarpSize / kLanesPerRow;
  constexpr int kRowSlots = kRowsPerWarp * kWarps;
  static_assert(kVecsPerLane * kVec * kLanesPerRow == kHeadDim, "head_dim must be whole 16-byte vectors per lane");
  __shared__ float sm_m[kWarps][kGroup], sm_l[kWarps][kGroup];
  __shared__ float sm_acc[kWarps][kGroup][kHeadDim];

  const int64_t n_chunks = plan.n_chunks, head_blocks = n_heads / group;
  const int64_t c = blockIdx.x % n_chunks, tb = blockIdx.x / n_chunks;
  const int64_t t = tb / head_blocks, h0 = (tb % head_blocks) * group;
  const TreeView view = tree_view(tree, t);
  const int64_t n_ctx = view.span(positions[t]);
  if (c >= plan.chunks_used(n_ctx)) return;  // this token's context ends before the chunk: the merge never reads it
  const int64_t begin = plan.chunk_begin(c), end = plan.chunk_end(c, n_ctx);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int row = lane / kLanesPerRow, rl = lane % kLanesPerRow;
  const int row_slot = warp * kRowsPerWarp + row;
  const int64_t kv_base = h0 / (n_heads / n_kv_heads) * kHeadDim;
  const int64_t width = n_kv_heads * kHeadDim;
  const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t]) * max_blocks;

  float qv[kGroup][kElems], acc[kGroup][kElems], m[kGroup], l[kGroup];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVecsPerLane; ++i) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int d = (i * kLanesPerRow + rl) * kVec + e;
        qv[g][i * kVec + e] = g < group ? q[(t * n_heads + h0 + g) * kHeadDim + d] : 0.0f;
        acc[g][i * kVec + e] = 0.0f;
      }
    }
  }

  // The row slot's position as (page index, offset in the page), stepped by kRowSlots without a divide per key
  // (begin is page aligned). Each step reads kUnroll keys per row slot, all loads issued before any is used, so more
  // bytes are in flight per warp.
  int page = static_cast<int>(begin / page_size) + row_slot / page_size;
  int off = row_slot % page_size;
  for (int64_t j0 = begin; j0 < end; j0 += kUnroll * kRowSlots) {  // uniform across the block: all reach the shuffles
    float kr[kUnroll][kElems], vr[kUnroll][kElems];
    bool valid[kUnroll];  // uniform across the row's lanes: in the chunk and seen (a tree token's mask)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + u * kRowSlots + row_slot;
      valid[u] = j < end && view.sees(j);
      if (valid[u]) {
        const int64_t base = (static_cast<int64_t>(table[page]) * page_size + off) * width + kv_base;
#pragma unroll
        for (int i = 0; i < kVecsPerLane; ++i) {
          const int64_t d0 = (i * kLanesPerRow + rl) * kVec;
          KvVec<kCode>::load(k_cache, base + d0, kr[u] + i * kVec);
          KvVec<kCode>::load(v_cache, base + d0, vr[u] + i * kVec);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) kr[u][e] = vr[u][e] = 0.0f;
      }
      off += kRowSlots;
      while (off >= page_size) {
        off -= page_size;
        ++page;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (g < group) {  // uniform across the block
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < kElems; ++e) dot += qv[g][e] * kr[u][e];
          const float score = warp_sum<kLanesPerRow>(dot) * scale;
          if (valid[u]) {
            const SoftmaxMerge s = softmax_merge(m[g], l[g], score, 1.0f);
#pragma unroll
            for (int e = 0; e < kElems; ++e) acc[g][e] = acc[g][e] * s.fa + vr[u][e] * s.fb;
            m[g] = s.m;
            l[g] = s.l;
          }
        }
      }
    }
  }

  // Merge the warp's row slots: lanes rl of all rows hold the same elements, kLanesPerRow apart.
#pragma unroll
  for (int mask = kLanesPerRow; mask < kWarpSize; mask <<= 1) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (g < group) {
        const SoftmaxMerge s = softmax_merge(m[g], l[g], SERVETUNE_SHFL_XOR(m[g], mask), SERVETUNE_SHFL_XOR(l[g], mask));
#pragma unroll
        for (int e = 0; e < kElems; ++e) acc[g][e] = acc[g][e] * s.fa + SERVETUNE_SHFL_XOR(acc[g][e], mask) * s.fb;
        m[g] = s.m;
        l[g] = s.l;
      }
    }
  }
  if (row == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (rl == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
#pragma unroll
      for (int i = 0; i < kVecsPerLane; ++i) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) sm_acc[warp][g][(i * kLanesPerRow + rl) * kVec + e] = acc[g][i * kVec + e];
      }
    }
  }
  __syncthreads();

  // Merge the warps (one may have seen nothing: the chunk is shorter than kRowSlots) into the chunk's partial.
  for (int e = static_cast<int>(threadIdx.x); e < group * kHeadDim; e += static_cast<int>(blockDim.x)) {
    const int g = e / kHeadDim, d = e % kHeadDim;
    float mm = -INFINITY, ll = 0.0f, aa = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) softmax_merge_into(mm, ll, aa, sm_m[w][g], sm_l[w][g], sm_acc[w][g][d]);
    const int64_t part = (t * n_heads + h0 + g) * n_chunks + c;
    part_acc[part * kHeadDim + d] = aa;
    if (d == 0) {
      part_ml[2 * part] = mm;
      part_ml[2 * part + 1] = ll;
    }
  }
}

// One block per (token, query head): the chunks the token used, merged in order, then normalised.
__global__ void merge_chunks_kernel(const float* part_ml, const float* part_acc, const int32_t* positions, TreeMasks tree,
                                    SplitPlan plan, int64_t n_heads, int64_t head_dim, float* out) {
  const int64_t th = blockIdx.x, t = th / n_heads;
  const int64_t used = plan.chunks_used(tree_view(tree, t).span(positions[t]));
  const float* ml = part_ml + th * plan.n_chunks * 2;
  const float* acc = part_acc + th * plan.n_chunks * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float mm = -INFINITY, ll = 0.0f, aa = 0.0f;
    for (int64_t c = 0; c < used; ++c) softmax_merge_into(mm, ll, aa, ml[2 * c], ml[2 * c + 1], acc[c * head_dim + d]);
    out[th * head_dim + d] = aa / ll;
  }
}

template <int kCode, int kHeadDim, int kGroup>
void launch_split(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, int group, float scale,
                  const SplitPlan& plan, float* part_ml, float* part_acc, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(b.n_tokens * (n_heads / group) * plan.n_chunks);
  split_attention_kernel<kCode, kHeadDim, kGroup><<<blocks, kWarps * kWarpSize, 0, stream>>>(
      kv.k, kv.v, static_cast<int>(kv.page_size), kv.n_kv_heads, b.positions, b.seq_of_token, b.block_tables,
      b.max_blocks_per_seq, tree_masks(b), q, n_heads, group, scale, plan, part_ml, part_acc);
}

template <int kCode, int kHeadDim>
void launch_split_group(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, float scale,
                        const SplitPlan& plan, float* part_ml, float* part_acc, cudaStream_t stream) {
  const int group = static_cast<int>(heads_per_block(n_heads / kv.n_kv_heads));
  if (group <= 1) launch_split<kCode, kHeadDim, 1>(kv, b, q, n_heads, group, scale, plan, part_ml, part_acc, stream);
  else if (group <= 2) launch_split<kCode, kHeadDim, 2>(kv, b, q, n_heads, group, scale, plan, part_ml, part_acc, stream);
  else if (group <= 4) launch_split<kCode, kHeadDim, 4>(kv, b, q, n_heads, group, scale, plan, part_ml, part_acc, stream);
  else launch_split<kCode, kHeadDim, kMaxGroup>(kv, b, q, n_heads, group, scale, plan, part_ml, part_acc, stream);
}

template <int kCode>
void launch_split_head_dim(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, float scale,
                           const SplitPlan& plan, float* part_ml, float* part_acc, cudaStream_t stream) {
  if (kv.head_dim == 64) launch_split_group<kCode, 64>(kv, b, q, n_heads, scale, plan, part_ml, part_acc, stream);
  else if (kv.head_dim == 128) launch_split_group<kCode, 128>(kv, b, q, n_heads, scale, plan, part_ml, part_acc, stream);
  else launch_split_group<kCode, 256>(kv, b, q, n_heads, scale, plan, part_ml, part_acc, stream);
}

}  // namespace

SplitPlan plan_attention_split(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads, int64_t sm_count) {
  SplitPlan single;
  single.page_size = kv.page_size;
  const bool shape = kv.head_dim == 64 || kv.head_dim == 128 || kv.head_dim == 256;
  const bool type = kv.dtype == DType::kF32 || kv.dtype == DType::kF16 || kv.dtype == DType::kBF16 ||
                    kv.dtype == DType::kFP8_E4M3;
  // 16-byte loads need 16-byte aligned rows: the head_dims above make every row offset a multiple of 16 bytes.
  const bool aligned = reinterpret_cast<uintptr_t>(kv.k) % 16 == 0 && reinterpret_cast<uintptr_t>(kv.v) % 16 == 0;
  if (!shape || !type || !aligned || kv.n_kv_heads <= 0 || n_heads <= 0 ||
      n_heads % kv.n_kv_heads != 0) {
    return single;
  }
  const int64_t units = batch.n_tokens * (n_heads / heads_per_block(n_heads / kv.n_kv_heads));
  return plan_split_attention(units, batch.max_blocks_per_seq, kv.page_size, sm_count);
}

size_t split_attention_scratch_floats(const SplitPlan& plan, int64_t n_tokens, int64_t n_heads, int64_t head_dim) {
  return static_cast<size_t>(n_tokens * n_heads * plan.n_chunks * (head_dim + 2));
}

void launch_attention_split(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                            float scale, const SplitPlan& plan, float* scratch, float* out, cudaStream_t stream) {
  if (batch.n_tokens == 0) return;
  float* part_ml = scratch;
  float* part_acc = scratch + 2 * batch.n_tokens * n_heads * plan.n_chunks;
  const int code = elem_code(kv.dtype);
  if (code == kElemF16) launch_split_head_dim<kElemF16>(kv, batch, q, n_heads, scale, plan, part_ml, part_acc, stream);
  else if (code == kElemFp8) launch_split_head_dim<kElemFp8>(kv, batch, q, n_heads, scale, plan, part_ml, part_acc, stream);
  else if (code == kElemBf16) launch_split_head_dim<kElemBf16>(kv, batch, q, n_heads, scale, plan, part_ml, part_acc, stream);
  else launch_split_head_dim<kElemF32>(kv, batch, q, n_heads, scale, plan, part_ml, part_acc, stream);
  check(cudaGetLastError(), "split attention kernel");
  merge_chunks_kernel<<<static_cast<unsigned>(batch.n_tokens * n_heads), static_cast<unsigned>(kv.head_dim), 0, stream>>>(
      part_ml, part_acc, batch.positions, tree_masks(batch), plan, n_heads, kv.head_dim, out);
  check(cudaGetLastError(), "split attention merge kernel");
}

}  // namespace servetune::gpu
