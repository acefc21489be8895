// Mixture-of-experts row kernels of the GPU backend: the deterministic scatter-add that combines the experts' outputs
// into their tokens' rows, and the per-head packing of head_matmul's inputs for a batched bf16 GEMM.
// Invariant of the scatter: each destination row's adds happen in index order by one thread per column (no atomics),
// so repeated rows sum exactly as the CPU backend's loop does, whatever the grid.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/moe_kernels.h"

namespace servetune::gpu {
namespace {

constexpr int kThreads = 256;
// Entries per destination group the scatter aims for: more groups run more blocks side by side, but every block
// scans all n entries to find its own.
constexpr int64_t kEntriesPerGroup = 16;
constexpr int64_t kMaxGroups = 256;

// Block (column tile, g) owns the destination rows r with r % groups == g: disjoint rows per group, so no two
// blocks touch one value, and each thread walks the entries in index order for its column. Entries come through
// shared memory a tile at a time (their row, or -1 when another group owns it, and their weight).
__global__ void scatter_add_rows_kernel(const float* src, const int32_t* rows, const float* weights, int64_t n,
                                        int64_t width, int groups, float* dst) {
  __shared__ int32_t tile_rows[kThreads];
  __shared__ float tile_weights[kThreads];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int g = static_cast<int>(blockIdx.y);
  for (int64_t i0 = 0; i0 < n; i0 += kThreads) {
    const int64_t i = i0 + threadIdx.x;
    if (i < n) {
      const int32_t r = rows[i];
      tile_rows[threadIdx.x] = (r >= 0 && r % groups == g) ? r : -1;
      tile_weights[threadIdx.x] = weights[i];
    }
    __syncthreads();
    const int count = static_cast<int>(n - i0 < kThreads ? n - i0 : kThreads);
    if (c < width) {
      for (int j = 0; j < count; ++j) {
        const int32_t r = tile_rows[j];
        if (r < 0) continue;
        dst[static_cast<int64_t>(r) * width + c] += tile_weights[j] * src[(i0 + j) * width + c];
      }
    }
    __syncthreads();  // the tile is rewritten next round
  }
}

__global__ void pack_heads_bf16_kernel(const float* x, int64_t x_row, int64_t x_head, int64_t n, int64_t n_heads,
                                       int64_t cols, uint16_t* dst) {
  const int64_t total = n_heads * n * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % cols, t = (i / cols) % n, h = i / (cols * n);
    dst[i] = f32_to_bf16_bits(x[t * x_row + h * x_head + c]);
  }
}

}  // namespace

void launch_scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n, int64_t width,
                             float* dst, cudaStream_t stream) {
  if (n <= 0 || width <= 0) return;
  const int64_t groups = std::clamp<int64_t>(n / kEntriesPerGroup, 1, kMaxGroups);
  const dim3 grid(static_cast<unsigned>((width + kThreads - 1) / kThreads), static_cast<unsigned>(groups));
  scatter_add_rows_kernel<<<grid, kThreads, 0, stream>>>(src, rows, weights, n, width, static_cast<int>(groups), dst);
  check(cudaGetLastError(), "scatter_add_rows kernel");
}

void launch_pack_heads_bf16(const float* x, int64_t x_row, int64_t x_head, int64_t n, int64_t n_heads, int64_t cols,
                            uint16_t* dst, cudaStream_t stream) {
  const int64_t total = n_heads * n * cols;
  if (total <= 0) return;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 65535);
  pack_heads_bf16_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, x_row, x_head, n, n_heads, cols, dst);
  check(cudaGetLastError(), "pack_heads_bf16 kernel");
}

}  // namespace servetune::gpu
