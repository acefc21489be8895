// Latent (MLA) cache kernels of the GPU backend: the store of [latent | rotary key] rows, and absorbed attention, in
// which every query head scores the same cached row. Cache layout: one row of kv.head_dim elements per slot
// (slot = block * page_size + offset), row-major like the CPU backend's latent cache; only these kernels read or write
// it on the GPU. Attention: one block per (token, group of kGroup heads), each warp owning kHeadsPerWarp heads; the
// block stages kTile cached rows in shared memory (each row loaded once for the whole group), the warps score them
// (one warp-wide dot per head and row), and keep an online softmax and the weighted sum of the rows' first v_dim
// values in registers. Small grids (decode of a few sequences) also split each token's positions over several
// blocks and merge their partial softmaxes after (flash-decoding). Draft-tree tokens (tree_mask.h) scan their span and
// give the rows their mask hides no weight.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/elem.h"
#include "backend/cuda/moe_kernels.h"
#include "backend/cuda/tree_mask.h"
#include "core/error.h"

namespace servetune::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;  // 8 on NVIDIA, 4 on gfx90a
constexpr int kHeadsPerWarp = 2;
constexpr int kGroup = kWarps * kHeadsPerWarp;  // query heads per block
constexpr int kTile = 16;                       // cached rows per shared-memory tile: 16 * 640 * 4 = 40 KiB at most
constexpr int64_t kManyBlocks = 256;            // at least this many (token, head group) blocks: no split
constexpr int64_t kMinSplitPositions = 256;     // a split covers at least this many positions
constexpr int64_t kMaxSplits = 64;

__global__ void store_latent_kernel(void* cache, int code, int64_t capacity, int64_t width, const float* latent,
                                    int64_t latent_width, const float* rope_key, const int32_t* slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= capacity) return;  // the runner never passes one; never write outside the cache
  const int64_t rope_width = width - latent_width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float v = i < latent_width ? latent[t * latent_width + i] : rope_key[t * rope_width + (i - latent_width)];
    store_elem(cache, slot * width + i, code, v);
  }
}

// Grid: x = token * head groups, y = split. Splits > 1: each writes its lanes' partial [max, sum, v_dim sums] to
// `partial` (lane-major: (t * n_heads + h) * splits + split), unnormalised; otherwise the output itself.
template <int kPerLane>
__global__ void __launch_bounds__(kThreads) latent_attention_kernel(
    const void* cache, int code, int page_size, int width, const int32_t* positions, const int32_t* seq_of_token,
    const int32_t* block_tables, int64_t max_blocks, TreeMasks tree, const float* q, int n_heads, int v_dim, float scale,
    int splits, float* out, float* partial) {
  extern __shared__ float rows_sm[];  // [kTile][width]
  const int groups = (n_heads + kGroup - 1) / kGroup;
  const int64_t t = blockIdx.x / groups;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int h_warp = static_cast<int>(blockIdx.x % groups) * kGroup + warp * kHeadsPerWarp;
  const TreeView view = tree_view(tree, t);
  const int span = static_cast<int>(view.span(positions[t]));
  const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
  int begin = 0, end = span;
  if (splits > 1) {  // this token's positions in `used` near-equal chunks; splits past them see nothing
    const int used = min(splits, max(1, static_cast<int>((span + kMinSplitPositions - 1) / kMinSplitPositions)));
    const int chunk = (span + used - 1) / used;
    begin = min(span, static_cast<int>(blockIdx.y) * chunk);
    end = min(span, begin + chunk);
  }

  float qv[kHeadsPerWarp][kPerLane], acc[kHeadsPerWarp][kPerLane], m[kHeadsPerWarp], l[kHeadsPerWarp];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const int h = h_warp + hh;
    m[hh] = -INFINITY;
    l[hh] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      qv[hh][i] = (h < n_heads && d < width) ? q[(t * n_heads + h) * width + d] : 0.0f;
      acc[hh][i] = 0.0f;
    }
  }
  for (int p0 = begin; p0 < end; p0 += kTile) {
    const int count = min(kTile, end - p0);
    __syncthreads();  // every warp is done with the previous tile
    for (int p = 0; p < count; ++p) {
      const int pos = p0 + p;
      const int64_t slot = static_cast<int64_t>(table[pos / page_size]) * page_size + pos % page_size;
      for (int c = threadIdx.x; c < width; c += kThreads) rows_sm[p * width + c] = load_elem(cache, slot * width + c, code);
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
      if (h_warp + hh >= n_heads) continue;  // uniform across the warp
      // Raw scores (q . row); the scale goes into the exponent, as the CPU reference does.
      float s[kTile];
      bool seen[kTile];  // uniform across the block
      float tile_max = -INFINITY;
#pragma unroll
      for (int p = 0; p < kTile; ++p) {
        s[p] = -INFINITY;
        seen[p] = p < count && view.sees(p0 + p);
        if (seen[p]) {
          float dot = 0.0f;
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) {
            const int d = lane + i * kWarpSize;
            if (d < width) dot += qv[hh][i] * rows_sm[p * width + d];
          }
          s[p] = warp_sum(dot);
          tile_max = fmaxf(tile_max, s[p]);
        }
      }
      const float m_new = fmaxf(m[hh], tile_max);
      if (m_new == -INFINITY) continue;  // nothing seen yet (a tile of masked rows first): the partial stays empty
      const float correction = expf((m[hh] - m_new) * scale);  // 0 on the first tile (m = -inf)
      float sum = 0.0f;
#pragma unroll
      for (int p = 0; p < kTile; ++p) {
        s[p] = seen[p] ? expf((s[p] - m_new) * scale) : 0.0f;
        sum += s[p];
      }
      l[hh] = l[hh] * correction + sum;
      m[hh] = m_new;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + i * kWarpSize;
        if (d >= v_dim) continue;
        float a = acc[hh][i] * correction;
#pragma unroll
        for (int p = 0; p < kTile; ++p) {
          if (seen[p]) a += s[p] * rows_sm[p * width + d];  // rows past `count` are stale, masked ones unweighted
        }
        acc[hh][i] = a;
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const int h = h_warp + hh;
    if (h >= n_heads) continue;
    const int64_t lane_index = t * n_heads + h;
    if (splits == 1) {
      const float inv = 1.0f / l[hh];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + i * kWarpSize;
        if (d < v_dim) out[lane_index * v_dim + d] = acc[hh][i] * inv;
      }
      continue;
    }
    float* part = partial + (lane_index * splits + blockIdx.y) * (2 + static_cast<int64_t>(v_dim));
    if (lane == 0) {
      part[0] = m[hh];  // -inf and 0 for a split that saw no position
      part[1] = l[hh];
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < v_dim) part[2 + d] = acc[hh][i];
    }
  }
}

// One block per (token, head) lane: its splits' partials rescaled to the overall max and added in split order.
__global__ void latent_merge_kernel(const float* partial, int splits, int v_dim, float scale, float* out) {
  const int64_t lane_index = blockIdx.x;
  const int64_t stride = 2 + static_cast<int64_t>(v_dim);
  const float* parts = partial + lane_index * splits * stride;
  float m_all = -INFINITY;
  for (int s = 0; s < splits; ++s) m_all = fmaxf(m_all, parts[s * stride]);
  for (int d = threadIdx.x; d < v_dim; d += blockDim.x) {
    float l = 0.0f, a = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* p = parts + s * stride;
      if (p[1] <= 0.0f) continue;  // saw no position
      const float f = expf((p[0] - m_all) * scale);
      l += p[1] * f;
      a += p[2 + d] * f;
    }
    out[lane_index * v_dim + d] = a / l;
  }
}

int64_t head_groups(int64_t n_heads) { return (n_heads + kGroup - 1) / kGroup; }

int64_t split_count(const KvLayerView& kv, const AttentionBatch& b, int64_t n_heads) {
  const int64_t blocks = b.n_tokens * head_groups(n_heads);
  if (blocks == 0 || blocks >= kManyBlocks) return 1;
  // The block tables bound every token's positions; each token splits only as far as its own span allows (device).
  const int64_t longest = b.max_blocks_per_seq * kv.page_size;
  const int64_t by_length = (longest + kMinSplitPositions - 1) / kMinSplitPositions;
  return std::clamp<int64_t>(std::min((kManyBlocks + blocks - 1) / blocks, by_length), 1, kMaxSplits);
}

template <int kPerLane>
void launch_with(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, int64_t v_dim,
                 float scale, float* out, float* scratch, int64_t splits, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(b.n_tokens * head_groups(n_heads)), static_cast<unsigned>(splits));
  const size_t shared = static_cast<size_t>(kTile) * static_cast<size_t>(kv.head_dim) * sizeof(float);
  latent_attention_kernel<kPerLane><<<grid, kThreads, shared, stream>>>(
      kv.k, elem_code(kv.dtype), static_cast<int>(kv.page_size), static_cast<int>(kv.head_dim), b.positions,
      b.seq_of_token, b.block_tables, b.max_blocks_per_seq, tree_masks(b), q, static_cast<int>(n_heads),
      static_cast<int>(v_dim), scale, static_cast<int>(splits), out, scratch);
  check(cudaGetLastError(), "attention_latent kernel");
  if (splits == 1) return;
  latent_merge_kernel<<<static_cast<unsigned>(b.n_tokens * n_heads), kThreads, 0, stream>>>(
      scratch, static_cast<int>(splits), static_cast<int>(v_dim), scale, out);
  check(cudaGetLastError(), "attention_latent merge kernel");
}

}  // namespace

void launch_store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width, const float* rope_key,
                         const int32_t* slots, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  store_latent_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      kv.k, elem_code(kv.dtype), kv.num_blocks * kv.page_size, kv.head_dim, latent, latent_width, rope_key, slots);
  check(cudaGetLastError(), "store_latent kernel");
}

int64_t attention_latent_scratch_floats(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads, int64_t v_dim) {
  const int64_t splits = split_count(kv, batch, n_heads);
  return splits == 1 ? 0 : batch.n_tokens * n_heads * splits * (2 + v_dim);
}

void launch_attention_latent(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                             int64_t v_dim, float scale, float* out, float* scratch, cudaStream_t stream) {
  if (batch.n_tokens == 0 || n_heads == 0) return;
  if (kv.head_dim > kMaxLatentWidth) {
    throw_unsupported("latent cache rows of " + std::to_string(kv.head_dim) + " values exceed the GPU latent attention "
                      "kernel's limit (" + std::to_string(kMaxLatentWidth) + ")");
  }
  const int64_t splits = split_count(kv, batch, n_heads);
  const int64_t per_lane = (kv.head_dim + kWarpSize - 1) / kWarpSize;
  if (per_lane <= 2) launch_with<2>(kv, batch, q, n_heads, v_dim, scale, out, scratch, splits, stream);
  else if (per_lane <= 4) launch_with<4>(kv, batch, q, n_heads, v_dim, scale, out, scratch, splits, stream);
  else if (per_lane <= 8) launch_with<8>(kv, batch, q, n_heads, v_dim, scale, out, scratch, splits, stream);
  else launch_with<kMaxLatentWidth / kWarpSize>(kv, batch, q, n_heads, v_dim, scale, out, scratch, splits, stream);
}

}  // namespace servetune::gpu
