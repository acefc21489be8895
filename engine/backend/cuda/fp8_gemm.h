// FP8 (e4m3) GEMMs of 128x128 block-scaled weights (kFP8_E4M3_B128) through cuBLASLt on sm_90, CUDA builds only (the
// HIP build and SERVETUNE_GPU_GEMM=tiled keep such weights as bf16, converted at load). Activations are quantized on
// the device to e4m3 with one f32 scale per token and 128 columns (fp8_layout.h's quantize_fp8_groups), then one
// cublasLtMatmul: A = the weight, transposed ("TN", as FP8 on Hopper requires), with CUBLASLT_MATMUL_MATRIX_SCALE_
// BLK128x128_32F scales; B = the activations with CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; f32 accumulate and output.
// Descriptors and the heuristic's algorithm are cached per shape; the cuBLASLt handle is made once per backend.
#pragma once

#if !defined(SERVETUNE_HIP)

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "backend/backend.h"
#include "backend/cuda/gpu_shim.h"

namespace servetune::gpu {

// Whether device 0 is sm_90 (queried once): cuBLASLt's 128-element and 128x128 block scaling run on compute
// capability 9.0 only (the cuBLAS documentation's "Scaling Mode Support Overview"; Blackwell has MXFP8 instead, a
// different scale format), so older and newer GPUs keep FP8 weights as bf16.
bool fp8_block_gemm_supported();

// x [n, cols] f32 row-major into e4m3 codes [n_pad, cols] and scales [ceil(cols / 128), n_pad] (token-contiguous),
// n_pad = fp8_gemm_tokens(n); padded tokens get code 0 and scale 1. codes and scales 16-byte aligned.
void launch_quantize_fp8_groups(const float* x, int64_t n, int64_t cols, uint8_t* codes, float* scales, cudaStream_t stream);

class Fp8Gemm {
 public:
  Fp8Gemm();
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // out [n_pad, w.rows] row-major (16-byte aligned) = activations . W^T, the activations as launch_quantize_fp8_groups
  // left them for n_pad tokens; `workspace` (256-byte aligned) is cuBLASLt's, used on `stream` only.
  void run(const WeightMatrix& w, const uint8_t* codes, const float* scales, int64_t n_pad, float* out, void* workspace,
           size_t workspace_bytes, cudaStream_t stream);
  // Why cuBLASLt has no algorithm for a [rows, cols] weight (its heuristic asked for 4 tokens, a decode step's padded
  // count), or "" when it has one (that plan is kept). `stand_in` is any 256-byte-aligned device address for the scale
  // pointers, which the heuristic does not read. Runs nothing on the device.
  std::string unsupported_reason(int64_t rows, int64_t cols, const void* stand_in, size_t workspace_bytes);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The descriptors and algorithm of one shape (rows, cols, n_pad, workspace size), made on first use.
  Plan& plan(const WeightMatrix& w, const float* a_scales, const float* b_scales, int64_t n_pad, size_t workspace_bytes);
  static void destroy(Plan& p);

  cublasLtHandle_t handle_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, size_t>, Plan> plans_;
};

}  // namespace servetune::gpu

#endif  // !SERVETUNE_HIP
