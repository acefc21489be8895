// Plain tiled GEMM y[n, rows] = x[n, cols] . W[rows, cols]^T (W f32 or bf16, f32 accumulate): the HIP build's
// matmul, since Debian packages no hipBLAS/rocBLAS (the CUDA build uses cuBLAS instead). Its batched form (blockIdx.z:
// one weight slice and strided x / y per batch) is head_matmul's GEMM there.
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_kernels.h"
#include "core/error.h"

namespace servetune::gpu {
namespace {

constexpr int kTile = 64;  // outputs per block side
constexpr int kStep = 16;  // reduction chunk
constexpr int kSub = 4;    // outputs per thread side (16 x 16 threads)

template <bool kBf16>
__global__ void gemm_tiled_kernel(const void* w, int64_t w_stride, const float* x, int64_t x_ld, int64_t n, int64_t rows,
                                  int64_t cols, float* y, int64_t y_ld, int64_t x_batch, int64_t y_batch) {
  // Batch z: weight rows [z * rows, (z + 1) * rows), x and y `x_batch` / `y_batch` floats further on.
  const int64_t z = blockIdx.z;
  w = static_cast<const char*>(w) + z * rows * w_stride * (kBf16 ? 2 : 4);
  x += z * x_batch;
  y += z * y_batch;
  __shared__ float xs[kStep][kTile + 1];
  __shared__ float ws[kStep][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTile, r0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[kSub][kSub] = {};
  for (int64_t k0 = 0; k0 < cols; k0 += kStep) {
    for (int i = threadIdx.x; i < kTile * kStep; i += blockDim.x) {
      const int row = i / kStep, kk = i % kStep;
      const int64_t t = t0 + row, r = r0 + row, k = k0 + kk;
      xs[kk][row] = (t < n && k < cols) ? x[t * x_ld + k] : 0.0f;
      float wv = 0.0f;
      if (r < rows && k < cols) {
        wv = kBf16 ? bf16_bits_to_f32(static_cast<const unsigned short*>(w)[r * w_stride + k])
                   : static_cast<const float*>(w)[r * w_stride + k];
      }
      ws[kk][row] = wv;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kStep; ++kk) {
      float a[kSub], b[kSub];
#pragma unroll
      for (int s = 0; s < kSub; ++s) {
        a[s] = xs[kk][ty * kSub + s];
        b[s] = ws[kk][tx * kSub + s];
      }
#pragma unroll
      for (int i = 0; i < kSub; ++i) {
#pragma unroll
        for (int j = 0; j < kSub; ++j) acc[i][j] += a[i] * b[j];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    const int64_t t = t0 + ty * kSub + i;
    if (t >= n) continue;
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      const int64_t r = r0 + tx * kSub + j;
      if (r < rows) y[t * y_ld + r] = acc[i][j];
    }
  }
}

}  // namespace

void launch_gemm_tiled_batched(const WeightMatrix& w, int64_t rows, int64_t batches, const float* x, int64_t x_ld,
                               int64_t x_batch, int64_t n, float* y, int64_t y_ld, int64_t y_batch, cudaStream_t stream) {
  if (n == 0 || rows == 0 || batches == 0) return;
  if (w.type != DType::kF32 && w.type != DType::kBF16) {
    throw Error(ErrorKind::kInternal, "GPU GEMM needs f32 or bf16 weights, got " + std::string(dtype_name(w.type)));
  }
  const dim3 grid(static_cast<unsigned>((rows + kTile - 1) / kTile), static_cast<unsigned>((n + kTile - 1) / kTile),
                  static_cast<unsigned>(batches));
  if (w.type == DType::kBF16) {
    gemm_tiled_kernel<true><<<grid, 256, 0, stream>>>(w.data, w.row_bytes / 2, x, x_ld, n, rows, w.cols, y, y_ld,
                                                      x_batch, y_batch);
  } else {
    gemm_tiled_kernel<false><<<grid, 256, 0, stream>>>(w.data, w.row_bytes / 4, x, x_ld, n, rows, w.cols, y, y_ld,
                                                       x_batch, y_batch);
  }
  check(cudaGetLastError(), "tiled GEMM kernel");
}

void launch_gemm_tiled(const WeightMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream) {
  launch_gemm_tiled_batched(w, w.rows, 1, x, w.cols, 0, n, y, w.rows, 0, stream);
}

}  // namespace servetune::gpu
