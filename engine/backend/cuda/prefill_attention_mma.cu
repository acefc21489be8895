// Paged causal attention on tensor cores for prefill-sized varlen batches (FlashAttention-2 with mma.sync m16n8k16,
// f16 or bf16 inputs, f32 accumulators; sm_80 and sm_90). A device plan cuts the flattened batch into tiles: runs of
// one sequence's tokens whose positions share a window of 64 / group positions (mma_fragments.h), so a tile never
// straddles sequences and mixes prefill chunks, chunks continuing cached positions and decode tokens alike. A block
// takes a tile for one KV head: its 64 rows are (token, query head of the GQA group) pairs, so each K/V tile read from
// the cache serves the whole group, and a decode token fills `group` rows rather than 1 of 64. Keys [0, the tile's
// last position] go through the block table 64 at a time into two shared-memory stages (cp.async: the next tile loads
// while one is computed; ldmatrix feeds the mma B operands); row r sees key j when j <= positions of
// its token (causal; earlier chunks' positions are in the cache). Q (f32 in memory) is scaled by scale * log2(e) in
// f32, then rounded to the cache's type; the online softmax runs in f32 base 2; P is rounded for the P.V mma; out f32.
// The HIP build compiles none of it (no NVIDIA mma): prefill_attention_mma_applies is false there and attention keeps
// attention.cu's kernel.
#include "backend/cuda/prefill_attention_mma.h"

#include <algorithm>
#include <cstdint>

#include "backend/cuda/mma_device.h"
#include "backend/cuda/mma_fragments.h"
#include "core/error.h"

namespace servetune::gpu {

#if !defined(SERVETUNE_HIP)
namespace {

using mma::kTileRows;
constexpr int kKeys = 64;                       // keys per shared-memory K/V tile
constexpr int kWarps = kTileRows / 16;          // each warp owns 16 rows (one m16 slice)
constexpr int kThreads = kWarps * 32;
// Shared rows are padded by 8 halves (16 bytes): with a row stride of (head_dim + 8) * 2 bytes (16 past a multiple of
// 128), the 8 row addresses of each ldmatrix phase fall in 8 different 16-byte bank groups, and rows stay 16-byte
// aligned for cp.async and ldmatrix.
constexpr int kPad = 8;
constexpr int kPlanThreads = 1024;
static_assert(kWarpSize == 32, "mma.sync fragments are defined for 32-lane warps");

// The plan: plan[0] = number of tiles, plan[1 + k] = first token of tile k, plan[1 + count] = n (so tile k is
// [plan[1 + k], plan[2 + k])). One block scans the tile starts (mma::tile_starts) 1024 tokens at a time.
__global__ void __launch_bounds__(kPlanThreads) plan_tiles_kernel(const int32_t* positions, const int32_t* seq_of_token,
                                                                  int n, int tokens, int32_t* plan) {
  __shared__ int warp_totals[kPlanThreads / 32];
  __shared__ int base;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  for (int c0 = 0; c0 < n; c0 += kPlanThreads) {
    const int t = c0 + static_cast<int>(threadIdx.x);
    int start = 0;
    if (t == 0) start = 1;
    else if (t < n) start = mma::tile_starts(t, seq_of_token[t], seq_of_token[t - 1], positions[t], positions[t - 1], tokens);
    int incl = start;  // inclusive scan over the warp
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane == 31) warp_totals[warp] = incl;
    __syncthreads();
    if (warp == 0) {  // inclusive scan over the 32 warps' totals
      int w = warp_totals[lane];
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += y;
      }
      warp_totals[lane] = w;
    }
    __syncthreads();
    if (start) plan[1 + base + (warp > 0 ? warp_totals[warp - 1] : 0) + incl - 1] = t;
    __syncthreads();  // every thread has read base and the totals
    if (threadIdx.x == 0) base += warp_totals[kPlanThreads / 32 - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    plan[0] = base;
    plan[1 + base] = n;
  }
}

// Dynamic shared memory of the kernel: two stages of a K and a V tile.
template <int kHeadDim>
constexpr int smem_bytes() {
  return 2 * 2 * kKeys * (kHeadDim + kPad) * static_cast<int>(sizeof(unsigned short));
}

// Issues the copies of keys key0 .. key0 + 63 of the sequence (block table `table`) into one stage, K at `sk` and V
// right after it (zeros past `last`: they are masked, and V rows must be finite since P = 0 multiplies them), and
// commits them as one cp.async group.
template <int kHeadDim>
__device__ __forceinline__ void load_kv_tile(unsigned short* sk, const unsigned short* k_cache, const unsigned short* v_cache,
                                             const int32_t* table, int page_size, int n_kv_heads, int kv_head, int key0,
                                             int last) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per cache row
  constexpr int kStride = kHeadDim + kPad;
  unsigned short* sv = sk + kKeys * kStride;
  for (int c = static_cast<int>(threadIdx.x); c < kKeys * kChunks; c += kThreads) {
    const int key = c / kChunks, chunk = c % kChunks;
    const int j = key0 + key;
    int64_t off = 0;
    if (j <= last) {
      const int64_t slot = static_cast<int64_t>(table[j / page_size]) * page_size + j % page_size;
      off = (slot * n_kv_heads + kv_head) * kHeadDim + chunk * 8;
    }
    const int bytes = j <= last ? 16 : 0;
    cp_async_16(sk + key * kStride + chunk * 8, k_cache + off, bytes);
    cp_async_16(sv + key * kStride + chunk * 8, v_cache + off, bytes);
  }
  cp_async_commit();
}

// Resident blocks per SM the register budget aims at: 3 (at most 168 registers a thread) fit head_dim 64 without
// spills; head_dim 128 needs more (ptxas spills at 168) and gets 2 (smem: 2 x 68 KiB).
template <int kHeadDim>
constexpr int kBlocksPerSm = kHeadDim <= 64 ? 3 : 2;

// One block per (tile slot, KV head), tiles taken grid-stride from the plan, latest (longest-context) tiles first.
// Warp w owns rows 16 w .. 16 w + 15; lane (g = lane / 4, q = lane % 4) holds rows 16 w + g and 16 w + g + 8 of every
// C fragment (mma_fragments.h), so its softmax state is two rows' (m, l) and its accumulators the two rows' columns
// 8 dt + 2 q, + 1 of each 8-column output tile dt. K/V tiles go through two shared-memory stages (cp.async): tile
// i + 1 loads while tile i is computed. Dynamic shared memory: smem_bytes<kHeadDim>().
template <bool kBf16, int kHeadDim>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kHeadDim>) prefill_attention_mma_kernel(
    const unsigned short* k_cache, const unsigned short* v_cache, int page_size, int n_kv_heads, const int32_t* positions,
    const int32_t* seq_of_token, const int32_t* block_tables, int64_t max_blocks, const float* q, int n_heads, int group,
    float q_scale, const int32_t* plan, float* out) {
  constexpr int kSteps = kHeadDim / 16;   // k-steps of S = Q K^T
  constexpr int kDimTiles = kHeadDim / 8;  // 8-column tiles of O
  constexpr int kStride = kHeadDim + kPad;
  constexpr int kTileElems = kKeys * kStride;  // one K or V tile
  extern __shared__ __align__(16) unsigned short smem[];  // stage st: K at 2 st * kTileElems, V right after
  __shared__ int s_last;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = mma::group_id(lane);
  const int kv_head = static_cast<int>(blockIdx.y);
  const int tokens = mma::tile_tokens(group);
  const int n_tiles = plan[0];

  for (int slot = static_cast<int>(blockIdx.x); slot < n_tiles; slot += static_cast<int>(gridDim.x)) {
    const int tile = n_tiles - 1 - slot;
    const int begin = plan[1 + tile], end = plan[2 + tile];
    // A plan tile holds at most `tokens` tokens when positions ascend within a sequence; longer ones are walked in
    // sub-tiles of `tokens`, so any input stays in bounds.
    for (int t0 = begin; t0 < end; t0 += tokens) {
      const int len = min(tokens, end - t0);
      if (threadIdx.x == 0) s_last = -1;
      __syncthreads();
      if (static_cast<int>(threadIdx.x) < len) atomicMax(&s_last, positions[t0 + threadIdx.x]);
      __syncthreads();
      const int last = s_last;  // the tile's latest position: keys [0, last]
      const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t0]) * max_blocks;

      // This lane's two rows: (token t0 + r / group, query head kv_head * group + r % group), r < tokens * group.
      int row_pos[2];
      int64_t row_base[2];  // element offset of the row in q and out
      uint32_t qa[kSteps][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + g + 8 * h;
        const int ti = r / group;
        const bool valid = r < tokens * group && ti < len;
        row_pos[h] = valid ? positions[t0 + ti] : -1;
        row_base[h] = valid ? (static_cast<int64_t>(t0 + ti) * n_heads + kv_head * group + r % group) * kHeadDim : 0;
      }
      // Q's A fragments: register m of k-step s holds elements 2m, 2m + 1 (consecutive columns) of row a_row.
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int h = m & 1;  // mma::a_row(lane, 2 m) is g + 8 (m & 1)
          const int col = 16 * s + mma::a_col(lane, 2 * m);
          float2 v = make_float2(0.0f, 0.0f);
          if (row_pos[h] >= 0) v = *reinterpret_cast<const float2*>(q + row_base[h] + col);
          qa[s][m] = pack2<kBf16>(v.x * q_scale, v.y * q_scale);
        }
      }
      int warp_last = max(row_pos[0], row_pos[1]);
      for (int o = 16; o > 0; o >>= 1) warp_last = max(warp_last, __shfl_xor_sync(0xffffffffu, warp_last, o));

      float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
      float acc[kDimTiles][4];
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;

      const auto load_tile = [&](int key0, int st) {
        load_kv_tile<kHeadDim>(smem + 2 * st * kTileElems, k_cache, v_cache, table, page_size, n_kv_heads, kv_head, key0, last);
      };
      const int n_key_tiles = last / kKeys + 1;
      load_tile(0, 0);
      for (int it = 0; it < n_key_tiles; ++it) {
        const int key0 = it * kKeys;
        // Prefetch the next tile into the other stage (read by the previous iteration, which every warp has left: the
        // barrier at the end of it); an empty group past the last tile keeps the wait below uniform.
        if (it + 1 < n_key_tiles) load_tile(key0 + kKeys, (it + 1) & 1);
        else cp_async_commit();
        cp_async_wait_one();  // this thread's copies of tile `it` have landed
        __syncthreads();      // and every thread's
        const unsigned short* sk = smem + 2 * (it & 1) * kTileElems;
        const unsigned short* sv = sk + kTileElems;
        if (key0 <= warp_last) {  // else every key of the tile is masked for this warp's rows (warp-uniform)
          // S = Q K^T for 8 tiles of 8 keys; one ldmatrix gives the B fragments of two k-steps (mma_fragments.h).
          float sc[kKeys / 8][4];
#pragma unroll
          for (int nt = 0; nt < kKeys / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const unsigned short* krow = sk + (8 * nt + mma::ldsm_k_key(lane)) * kStride + mma::ldsm_k_dim(lane);
#pragma unroll
            for (int s = 0; s < kSteps; s += 2) {
              uint32_t b[4];
              ldmatrix_x4<false>(b, krow + 16 * s);
              mma_16816<kBf16>(sc[nt], qa[s], b[0], b[1]);
              mma_16816<kBf16>(sc[nt], qa[s + 1], b[2], b[3]);
            }
          }
          // Causal mask and the tile's row maxima (each row's 64 scores are spread over the 4 lanes of its quad).
          float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
          for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i >> 1;  // c_row(lane, i) is g for i < 2, g + 8 otherwise
              if (key0 + 8 * nt + mma::c_col(lane, i) > row_pos[h]) sc[nt][i] = -INFINITY;
              tile_max[h] = fmaxf(tile_max[h], sc[nt][i]);
            }
          }
          float scale_old[2], m_ref[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
            tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
            const float m_new = fmaxf(m_run[h], tile_max[h]);
            m_ref[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row that has seen no key yet: exp2(-inf - 0) = 0, no NaN
            scale_old[h] = exp2f(m_run[h] - m_ref[h]);
            m_run[h] = m_new;
            l_run[h] *= scale_old[h];
          }
#pragma unroll
          for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i >> 1;
              sc[nt][i] = exp2f(sc[nt][i] - m_ref[h]);
              l_run[h] += sc[nt][i];  // this lane's share of the row sum; the quad's shares are added at the end
            }
          }
#pragma unroll
          for (int dt = 0; dt < kDimTiles; ++dt) {
            acc[dt][0] *= scale_old[0];
            acc[dt][1] *= scale_old[0];
            acc[dt][2] *= scale_old[1];
            acc[dt][3] *= scale_old[1];
          }
          // O += P V over 4 k-steps of 16 keys. P's A fragment is score tiles 2 kk and 2 kk + 1 (mma::a_from_c); one
          // transposing ldmatrix gives the B fragments (key, dim) of two 8-column tiles of V.
#pragma unroll
          for (int kk = 0; kk < kKeys / 16; ++kk) {
            uint32_t pa[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              int tile_off = 0;
              const int e = mma::a_from_c(2 * m, tile_off);
              pa[m] = pack2<kBf16>(sc[2 * kk + tile_off][e], sc[2 * kk + tile_off][e + 1]);
            }
            const unsigned short* vrow = sv + (16 * kk + mma::ldsm_v_key(lane)) * kStride + mma::ldsm_v_dim(lane);
#pragma unroll
            for (int dt = 0; dt < kDimTiles; dt += 2) {
              uint32_t b[4];
              ldmatrix_x4<true>(b, vrow + 8 * dt);
              mma_16816<kBf16>(acc[dt], pa, b[0], b[1]);
              mma_16816<kBf16>(acc[dt + 1], pa, b[2], b[3]);
            }
          }
        }
        __syncthreads();  // every warp is done with stage it & 1 before it is loaded again
      }

      // out = acc / l for the valid rows (every valid row saw at least its own position, so l > 0).
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (row_pos[h] < 0) continue;
        const float inv = 1.0f / l;
#pragma unroll
        for (int dt = 0; dt < kDimTiles; ++dt) {
          const int col = 8 * dt + mma::c_col(lane, 2 * h);
          *reinterpret_cast<float2*>(out + row_base[h] + col) = make_float2(acc[dt][2 * h] * inv, acc[dt][2 * h + 1] * inv);
        }
      }
      __syncthreads();  // s_last and the shared tiles are reused by the next sub-tile
    }
  }
}

template <bool kBf16, int kHeadDim>
void launch_kernel(const KvLayerView& kv, const AttentionBatch& b, const float* q, int n_heads, int group, float q_scale,
                   const int32_t* plan, float* out, cudaStream_t stream) {
  const int64_t tokens = mma::tile_tokens(group);
  // Tiles: at most one per token, and about n / tokens plus one partial tile per sequence; blocks past the plan's
  // count exit at once, and a plan with more tiles than blocks is walked grid-stride.
  const int64_t slots = std::min<int64_t>(b.n_tokens, (b.n_tokens + tokens - 1) / tokens + 256);
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(kv.n_kv_heads));
  constexpr int kSmem = smem_bytes<kHeadDim>();
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once (not a stream operation: allowed while capturing).
  static const cudaError_t opted_in = cudaFuncSetAttribute(prefill_attention_mma_kernel<kBf16, kHeadDim>,
                                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  check(opted_in, "cudaFuncSetAttribute (prefill attention shared memory)");
  prefill_attention_mma_kernel<kBf16, kHeadDim><<<grid, kThreads, kSmem, stream>>>(
      static_cast<const unsigned short*>(kv.k), static_cast<const unsigned short*>(kv.v), static_cast<int>(kv.page_size),
      static_cast<int>(kv.n_kv_heads), b.positions, b.seq_of_token, b.block_tables, b.max_blocks_per_seq, q, n_heads,
      group, q_scale, plan, out);
}

}  // namespace
#endif

bool prefill_attention_mma_applies(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads, const float* q,
                                   const float* out) {
#if defined(SERVETUNE_HIP)
  (void)kv, (void)batch, (void)n_heads, (void)q, (void)out;
  return false;
#else
  const auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  return batch.tree_mask == nullptr && batch.n_tokens >= kPrefillMmaMinTokens && batch.n_tokens <= INT32_MAX &&
         (kv.dtype == DType::kF16 || kv.dtype == DType::kBF16) && (kv.head_dim == 64 || kv.head_dim == 128) &&
         kv.n_kv_heads > 0 && n_heads > 0 && n_heads % kv.n_kv_heads == 0 &&
         mma::tile_tokens(static_cast<int>(n_heads / kv.n_kv_heads)) > 0 && kv.page_size > 0 && kv.page_size <= INT32_MAX &&
         aligned(kv.k, 16) && aligned(kv.v, 16) && aligned(q, 8) && aligned(out, 8);
#endif
}

size_t prefill_attention_mma_plan_bytes(int64_t n_tokens) { return static_cast<size_t>(n_tokens + 2) * sizeof(int32_t); }

void launch_prefill_attention_mma(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                                  float scale, void* plan, float* out, cudaStream_t stream) {
#if defined(SERVETUNE_HIP)
  (void)kv, (void)batch, (void)q, (void)n_heads, (void)scale, (void)plan, (void)out, (void)stream;
  throw_unsupported("the tensor-core prefill attention needs NVIDIA mma.sync");
#else
  const int group = static_cast<int>(n_heads / kv.n_kv_heads);
  auto* tiles = static_cast<int32_t*>(plan);
  plan_tiles_kernel<<<1, kPlanThreads, 0, stream>>>(batch.positions, batch.seq_of_token, static_cast<int>(batch.n_tokens),
                                                    mma::tile_tokens(group), tiles);
  check(cudaGetLastError(), "prefill attention plan kernel");
  const float q_scale = scale * 1.4426950408889634f;  // log2(e): the softmax runs in base 2 (exp2f)
  const int h = static_cast<int>(n_heads);
  if (kv.dtype == DType::kBF16) {
    if (kv.head_dim == 64) launch_kernel<true, 64>(kv, batch, q, h, group, q_scale, tiles, out, stream);
    else launch_kernel<true, 128>(kv, batch, q, h, group, q_scale, tiles, out, stream);
  } else {
    if (kv.head_dim == 64) launch_kernel<false, 64>(kv, batch, q, h, group, q_scale, tiles, out, stream);
    else launch_kernel<false, 128>(kv, batch, q, h, group, q_scale, tiles, out, stream);
  }
  check(cudaGetLastError(), "prefill attention mma kernel");
#endif
}

}  // namespace servetune::gpu
