// probe_gpu (gpu_backend.h): device 0's memory, the bandwidth of a 16-byte-per-thread copy kernel over two buffers far
// larger than L2, and the rate of a large square bf16 GEMM (cuBLAS, f32 accumulate; the HIP build has no BLAS and
// times its tiled kernel instead), each the best of several event-timed runs after a warm-up, on a stream of its own;
// on an sm_90 CUDA device also the engine's FP8 matmul (activation quantization + cuBLASLt block-scaled FP8 GEMM).
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/gpu_backend.h"
#include "backend/fp8_layout.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

#if !defined(SERVETUNE_HIP)
#include <cublas_v2.h>
#endif

namespace servetune {
namespace gpu {
namespace {

__global__ void copy_kernel(const uint4* src, uint4* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

// Events on one stream; seconds of the fastest of `runs` calls of fn after `warmup` untimed ones.
class Timer {
 public:
  explicit Timer(cudaStream_t stream) : stream_(stream) {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~Timer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  template <class F>
  double best_seconds(int warmup, int runs, F&& fn) {
    for (int i = 0; i < warmup; ++i) fn();
    float best_ms = 1e30f;
    for (int i = 0; i < runs; ++i) {
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      fn();
      check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(stop_), "probe run (cudaEventSynchronize)");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      best_ms = std::min(best_ms, ms);
    }
    return best_ms / 1e3;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace
}  // namespace gpu

DeviceProbe probe_gpu() {
  using namespace gpu;
  DeviceProbe p;
  p.device = SERVETUNE_GPU_VENDOR;
  // The backend owns allocation (with its out-of-memory message) and the on-device random fill.
  std::unique_ptr<Backend> backend = make_gpu_backend();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  p.name = prop.name;
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  p.total_bytes = static_cast<int64_t>(total);
  p.free_bytes = static_cast<int64_t>(free);
  Stream stream;
  Timer timer(stream.get());

  {
    // 1 GiB each way (less on a nearly full device): hundreds of times the L2, so the copy streams through HBM.
    const size_t bytes = std::min<size_t>(size_t{1} << 30, (free / 8) & ~size_t{15});
    auto src = backend->allocate(bytes), dst = backend->allocate(bytes);
    backend->fill_random(src->data(), DType::kF32, static_cast<int64_t>(bytes / 4), 1, 0.0f, 1.0f);
    backend->synchronize();
    const int64_t n = static_cast<int64_t>(bytes / 16);
    const unsigned blocks = static_cast<unsigned>(prop.multiProcessorCount) * 8;
    const double s = timer.best_seconds(2, 10, [&] {
      copy_kernel<<<blocks, 512, 0, stream.get()>>>(static_cast<const uint4*>(src->data()), static_cast<uint4*>(dst->data()), n);
      check(cudaGetLastError(), "copy kernel");
    });
    p.copy_buffer_bytes = static_cast<int64_t>(bytes);
    p.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / s;
    p.copy_what = "copy kernel, 16-byte loads and stores, " + std::to_string(bytes >> 20) + " MiB, best of 10";
  }
  {
#if defined(SERVETUNE_HIP)
    const int64_t m = 4096;  // the tiled kernel is slow: a smaller shape keeps the probe short
#else
    const int64_t m = 8192;
#endif
    const size_t elems = static_cast<size_t>(m * m);
    auto a = backend->allocate(elems * 2), c = backend->allocate(elems * 4);
    auto b = backend->allocate(elems * 4);  // bf16 for cuBLAS; f32 activations for the tiled kernel
    backend->fill_random(a->data(), DType::kBF16, m * m, 2, 0.0f, 0.02f);
#if defined(SERVETUNE_HIP)
    backend->fill_random(b->data(), DType::kF32, m * m, 3, 0.0f, 1.0f);
    backend->synchronize();
    const WeightMatrix w{a->data(), DType::kBF16, m, m, m * 2};
    const double s = timer.best_seconds(1, 3, [&] {
      launch_gemm_tiled(w, static_cast<const float*>(b->data()), m, static_cast<float*>(c->data()), stream.get());
    });
    p.gemm_what = "tiled kernel (no BLAS in the HIP build), bf16 weights x f32 activations, " + std::to_string(m) + "^3";
#else
    backend->fill_random(b->data(), DType::kBF16, m * m, 3, 0.0f, 1.0f);
    backend->synchronize();
    cublasHandle_t blas = nullptr;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) throw Error(ErrorKind::kInternal, "cublasCreate failed");
    cublasSetStream(blas, stream.get());
    const float alpha = 1.0f, beta = 0.0f;
    const int n = static_cast<int>(m);
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    double s = 0.0;
    try {
      s = timer.best_seconds(3, 10, [&] {
        const cublasStatus_t st = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a->data(), CUDA_R_16BF, n,
                                               b->data(), CUDA_R_16BF, n, &beta, c->data(), CUDA_R_16BF, n,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) status = st;
      });
    } catch (...) {
      cublasDestroy(blas);
      throw;
    }
    cublasDestroy(blas);
    if (status != CUBLAS_STATUS_SUCCESS) {
      throw Error(ErrorKind::kInternal, "cuBLAS error in the probe's bf16 GEMM: status " + std::to_string(static_cast<int>(status)));
    }
    p.gemm_what = "cuBLAS bf16 x bf16 -> bf16, f32 accumulate, " + std::to_string(m) + "^3, best of 10";
#endif
    p.gemm_flops = 2.0 * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(m) / s;
  }
#if !defined(SERVETUNE_HIP)
  if (backend->matrix_storage_type(DType::kFP8_E4M3_B128) == DType::kFP8_E4M3_B128) {
    // As a layer runs it (GpuBackend::fp8_gemm): f32 activations quantized per token and 128 columns, then the GEMM
    // with 128x128 weight scales, f32 out. Weight codes all e4m3 1.0 and scales 1 (the rate does not depend on them).
    const int64_t m = 8192;
    const size_t elems = static_cast<size_t>(m * m), workspace_bytes = size_t{32} << 20;
    const int64_t n_scales = fp8_blocks(m) * fp8_scale_stride(m);
    auto codes = backend->allocate(elems), scales = backend->allocate(static_cast<size_t>(n_scales) * 4);
    auto x = backend->allocate(elems * 4), y = backend->allocate(elems * 4), x_codes = backend->allocate(elems);
    auto x_scales = backend->allocate(static_cast<size_t>(fp8_blocks(m) * m) * 4), workspace = backend->allocate(workspace_bytes);
    backend->fill_random(scales->data(), DType::kF32, n_scales, 4, 1.0f, 0.0f);
    backend->fill_random(x->data(), DType::kF32, m * m, 5, 0.0f, 1.0f);
    backend->synchronize();
    check(cudaMemsetAsync(codes->data(), 0x38, elems, stream.get()), "cudaMemsetAsync");  // before the timed runs
    const WeightMatrix w{codes->data(), DType::kFP8_E4M3_B128, m, m, m,
                         BlockScales{static_cast<const float*>(scales->data()), fp8_scale_stride(m), 0}};
    Fp8Gemm gemm;
    auto* xc = static_cast<uint8_t*>(x_codes->data());
    auto* xs = static_cast<float*>(x_scales->data());
    const double s = timer.best_seconds(3, 10, [&] {
      launch_quantize_fp8_groups(static_cast<const float*>(x->data()), m, m, xc, xs, stream.get());
      gemm.run(w, xc, xs, m, static_cast<float*>(y->data()), workspace->data(), workspace_bytes, stream.get());
    });
    p.fp8_gemm_flops = 2.0 * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(m) / s;
    p.fp8_gemm_what = "activation quantization (1x128) + cuBLASLt FP8 e4m3 GEMM, 128x128 weight scales, f32 out, " +
                      std::to_string(m) + "^3, best of 10";
  }
#endif
  return p;
}

}  // namespace servetune
