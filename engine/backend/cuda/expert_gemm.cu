// The grouped expert GEMM on tensor cores (mma.sync m16n8k16 bf16, f32 accumulators; sm_80 and sm_90): one launch
// for every expert of a mixture-of-experts layer, the permuted-rows design of vLLM's fused MoE. Block (t, j) takes
// tile t of the plan (up to 16 or 64 rows of one expert) and output columns 64 j .. 64 j + 63, and walks the input
// columns 64 at a time: the activation rows (f32, rounded to bf16) and the expert's 64 weight rows (bf16, or FP8 e4m3
// scaled by their 128x128 block scale and rounded to bf16: weight-only dequantization) go through registers into
// shared memory, where ldmatrix feeds the mma operands; the next stage's global loads are issued before the current
// stage is multiplied. Decode steps (a few rows on each of many experts) read each expert's weights once; the SwiGLU
// form computes gate and up side by side and writes silu(gate) * up.
#include "backend/cuda/expert_gemm.h"

#include "backend/cuda/mma_device.h"
#include "backend/cuda/mma_fragments.h"
#include "core/error.h"

#if !defined(SERVETUNE_HIP)
#include <cuda_fp8.h>
#endif

namespace servetune::gpu {

#if !defined(SERVETUNE_HIP)
namespace {

constexpr int kCols = kExpertTileCols;
constexpr int kK = kExpertTileK;
constexpr int kStride = kExpertSmemStride;
static_assert(kWarpSize == 32, "mma.sync fragments are defined for 32-lane warps");

template <int kRows>
struct WarpLayout {
  static constexpr int kThreads = expert_threads(kRows);
  static constexpr int kWarpsN = expert_warps_n(kRows);
  static constexpr int kWarpCols = expert_warp_cols(kRows);
  static constexpr int kNTiles = kWarpCols / 8;  // 8-column mma tiles per warp
};

// One stage's global loads held in registers: kRows x 64 activations (float4s), and per matrix 64 x 64 weights as
// 16-byte vectors (8 bf16, or 16 FP8 codes with their scale).
template <int kRows, bool kFp8, int kMats>
struct Stage {
  static constexpr int kThreads = WarpLayout<kRows>::kThreads;
  static constexpr int kA = kRows * (kK / 4) / kThreads;
  static constexpr int kB = kCols * kK / (kFp8 ? 16 : 8) / kThreads;
  float4 a[kA];
  uint4 b[kMats][kB];
  float scale[kMats][kFp8 ? kB : 1];
};

template <int kRows, bool kFp8, int kMats>
__device__ __forceinline__ void load_stage(Stage<kRows, kFp8, kMats>& st, const float* x, int64_t row0, int rows, int64_t k,
                                           int64_t k0, const ExpertWeightRef* const* w, int64_t n0, int64_t n_cols) {
  using S = Stage<kRows, kFp8, kMats>;
#pragma unroll
  for (int i = 0; i < S::kA; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * S::kThreads;
    const int r = stage_a_row(idx);
    const int64_t col = k0 + stage_a_col(idx);
    // k is a multiple of 16, so a float4 is wholly inside or wholly past the row.
    st.a[i] = r < rows && col < k ? *reinterpret_cast<const float4*>(x + (row0 + r) * k + col) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  constexpr int kPer = kFp8 ? 16 : 8;  // values per 16-byte weight vector
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
#pragma unroll
    for (int i = 0; i < S::kB; ++i) {
      const int idx = static_cast<int>(threadIdx.x) + i * S::kThreads;
      const int64_t row = n0 + stage_b_row(idx, kPer);
      const int64_t col = k0 + stage_b_col(idx, kPer);
      const bool in = row < n_cols && col < k;
      const auto* base = static_cast<const unsigned char*>(w[m]->data);
      st.b[m][i] = in ? *reinterpret_cast<const uint4*>(base + row * w[m]->row_bytes + col * (kFp8 ? 1 : 2))
                      : make_uint4(0u, 0u, 0u, 0u);
      if constexpr (kFp8) {
        st.scale[m][i] = in ? w[m]->scales[(row + w[m]->scale_row_offset) / 128 * w[m]->scale_stride + col / 128] : 0.0f;
      }
    }
  }
}

// Eight FP8 e4m3 codes (two 32-bit words) times `scale`, as four bf16 pairs.
__device__ __forceinline__ void dequantize8(uint32_t lo, uint32_t hi, float scale, uint32_t (&out)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t word = j < 2 ? lo : hi;
    const auto pair = static_cast<__nv_fp8x2_storage_t>((word >> (16 * (j & 1))) & 0xffffu);
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
    out[j] = pack2<true>(f.x * scale, f.y * scale);
  }
}

template <int kRows, bool kFp8, int kMats>
__device__ __forceinline__ void store_stage(const Stage<kRows, kFp8, kMats>& st, unsigned short* as, unsigned short* bs) {
  using S = Stage<kRows, kFp8, kMats>;
#pragma unroll
  for (int i = 0; i < S::kA; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * S::kThreads;
    const int r = stage_a_row(idx), c = stage_a_col(idx);
    const float4 v = st.a[i];
    *reinterpret_cast<uint2*>(as + r * kStride + c) = make_uint2(pack2<true>(v.x, v.y), pack2<true>(v.z, v.w));
  }
  constexpr int kPer = kFp8 ? 16 : 8;
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
#pragma unroll
    for (int i = 0; i < S::kB; ++i) {
      const int idx = static_cast<int>(threadIdx.x) + i * S::kThreads;
      unsigned short* dst = bs + (m * kCols + stage_b_row(idx, kPer)) * kStride + stage_b_col(idx, kPer);
      if constexpr (kFp8) {
        uint32_t first[4], second[4];
        dequantize8(st.b[m][i].x, st.b[m][i].y, st.scale[m][i], first);
        dequantize8(st.b[m][i].z, st.b[m][i].w, st.scale[m][i], second);
        reinterpret_cast<uint4*>(dst)[0] = make_uint4(first[0], first[1], first[2], first[3]);
        reinterpret_cast<uint4*>(dst)[1] = make_uint4(second[0], second[1], second[2], second[3]);
      } else {
        *reinterpret_cast<uint4*>(dst) = st.b[m][i];
      }
    }
  }
}

// See the file comment. Block (blockIdx.x, blockIdx.y) = (plan tile, 64-column output slice).
template <int kRows, bool kFp8, bool kSwiGlu>
__global__ void __launch_bounds__(WarpLayout<kRows>::kThreads)
    expert_gemm_kernel(const ExpertTile* tiles, const int32_t* tile_count, const ExpertWeightRef* refs_a,
                       const ExpertWeightRef* refs_b, const float* x, int64_t k, int64_t n_cols, float* y) {
  constexpr int kMats = kSwiGlu ? 2 : 1;
  using L = WarpLayout<kRows>;
  __shared__ __align__(16) unsigned short as[kRows * kStride];
  __shared__ __align__(16) unsigned short bs[kMats * kCols * kStride];

  if (tile_count != nullptr && static_cast<int>(blockIdx.x) >= *tile_count) return;  // past a device plan's end
  const ExpertTile tile = tiles[blockIdx.x];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kCols;
  const ExpertWeightRef* w[kMats];
  w[0] = refs_a + tile.entry;
  if constexpr (kSwiGlu) w[1] = refs_b + tile.entry;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int wm = warp / L::kWarpsN, wn = warp % L::kWarpsN;  // expert_gemm_plan.h's warp layout

  float acc[kMats][L::kNTiles][4] = {};
  Stage<kRows, kFp8, kMats> st;
  load_stage(st, x, tile.row0, tile.rows, k, 0, w, n0, n_cols);
  store_stage(st, as, bs);
  __syncthreads();
  for (int64_t k0 = 0; k0 < k; k0 += kK) {
    const bool more = k0 + kK < k;
    if (more) load_stage(st, x, tile.row0, tile.rows, k, k0 + kK, w, n0, n_cols);  // in flight during the mmas
#pragma unroll
    for (int s = 0; s < kK / 16; s += 2) {
      uint32_t a0[4], a1[4];
      const unsigned short* arow = as + (16 * wm + mma::ldsm_a_row(lane)) * kStride + mma::ldsm_a_col(lane);
      ldmatrix_x4<false>(a0, arow + 16 * s);
      ldmatrix_x4<false>(a1, arow + 16 * (s + 1));
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
#pragma unroll
        for (int nt = 0; nt < L::kNTiles; ++nt) {
          uint32_t b[4];  // b0, b1 of k-step s, then of s + 1 (mma_fragments.h: ldsm_k_*)
          const int wrow = L::kWarpCols * wn + 8 * nt + mma::ldsm_k_key(lane);
          ldmatrix_x4<false>(b, bs + m * kCols * kStride + wrow * kStride + 16 * s + mma::ldsm_k_dim(lane));
          mma_16816<true>(acc[m][nt], a0, b[0], b[1]);
          mma_16816<true>(acc[m][nt], a1, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage
    if (more) {
      store_stage(st, as, bs);
      __syncthreads();
    }
  }

#pragma unroll
  for (int nt = 0; nt < L::kNTiles; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 16 * wm + mma::c_row(lane, i);
      const int64_t col = n0 + L::kWarpCols * wn + 8 * nt + mma::c_col(lane, i);
      if (r >= tile.rows || col >= n_cols) continue;
      float v = acc[0][nt][i];
      if constexpr (kSwiGlu) v = (v / (1.0f + expf(-v))) * acc[kMats - 1][nt][i];  // as silu_mul_kernel
      y[(tile.row0 + r) * n_cols + col] = v;
    }
  }
}

template <int kRows, bool kFp8>
void launch_rows(const ExpertTile* tiles, const int32_t* count, const dim3 grid, const ExpertWeightRef* a,
                 const ExpertWeightRef* b, const float* x, int64_t k, int64_t n_cols, float* y, cudaStream_t stream) {
  constexpr int kThreads = WarpLayout<kRows>::kThreads;
  if (b != nullptr) {
    expert_gemm_kernel<kRows, kFp8, true><<<grid, kThreads, 0, stream>>>(tiles, count, a, b, x, k, n_cols, y);
  } else {
    expert_gemm_kernel<kRows, kFp8, false><<<grid, kThreads, 0, stream>>>(tiles, count, a, nullptr, x, k, n_cols, y);
  }
}

}  // namespace
#endif

void launch_expert_gemm(const ExpertTile* tiles, int64_t n_tiles, const int32_t* tile_count, int tile_rows,
                        const ExpertWeightRef* a, const ExpertWeightRef* b, bool fp8, const float* x, int64_t k,
                        int64_t n_cols, float* y, cudaStream_t stream) {
#if defined(SERVETUNE_HIP)
  (void)tiles, (void)n_tiles, (void)tile_count, (void)tile_rows, (void)a, (void)b, (void)fp8, (void)x, (void)k,
      (void)n_cols, (void)y, (void)stream;
  throw_unsupported("the grouped expert GEMM needs NVIDIA mma.sync");
#else
  if (n_tiles <= 0 || n_cols <= 0) return;
  if (k % 16 != 0 || (tile_rows != 16 && tile_rows != 64) || n_tiles > INT32_MAX || (n_cols + kCols - 1) / kCols > 65535) {
    throw Error(ErrorKind::kInternal, "expert GEMM: k must be a multiple of 16, tiles 16 or 64 rows, and at most "
                                      "65535 64-column slices");
  }
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>((n_cols + kCols - 1) / kCols));
  const int32_t* count = tile_count;
  if (tile_rows == 16) {
    if (fp8) launch_rows<16, true>(tiles, count, grid, a, b, x, k, n_cols, y, stream);
    else launch_rows<16, false>(tiles, count, grid, a, b, x, k, n_cols, y, stream);
  } else {
    if (fp8) launch_rows<64, true>(tiles, count, grid, a, b, x, k, n_cols, y, stream);
    else launch_rows<64, false>(tiles, count, grid, a, b, x, k, n_cols, y, stream);
  }
  check(cudaGetLastError(), "expert GEMM kernel");
#endif
}

}  // namespace servetune::gpu
