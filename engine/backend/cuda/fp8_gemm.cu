// cuBLASLt FP8 GEMMs of block-scaled weights and the activations' 1x128 quantization kernel (see fp8_gemm.h).
// Every cuBLASLt call's status is checked and named. Nothing here allocates device memory: the caller passes the
// activation, output and workspace buffers (so graph captures record these calls as they are).
#if !defined(SERVETUNE_HIP)

#include "backend/cuda/fp8_gemm.h"

#include <cuda_fp8.h>

#include <string>

#include "backend/fp8_layout.h"
#include "core/error.h"

namespace servetune::gpu {
namespace {

constexpr int kGroupWarps = 8;  // token groups (one warp each) per block

// |value| maxima with NaN sticking, in the host reference's order of arguments (fp8_layout.h).
__device__ inline float nan_max(float candidate, float best) {
  return (candidate != candidate || candidate > best) ? candidate : best;
}

// One warp per (token, 128-column group): the group's largest |value|, its scale (fp8_group_scale), and e4m3 codes of
// value / scale (round to nearest even, saturating at 448, NaN kept: core's f32_to_fp8_e4m3).
__global__ void quantize_fp8_groups_kernel(const float* x, int64_t n, int64_t cols, int64_t n_pad, int64_t groups,
                                           uint8_t* codes, float* scales) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kGroupWarps + threadIdx.x / 32;
  if (item >= n_pad * groups) return;  // the whole warp leaves together
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t t = item / groups, g = item % groups, c0 = g * kFp8ScaleBlock;
  const int width = static_cast<int>(cols - c0 < kFp8ScaleBlock ? cols - c0 : kFp8ScaleBlock);
  uint8_t* out = codes + t * cols + c0;
  if (t >= n) {  // padding token
    for (int c = lane; c < width; c += 32) out[c] = 0;
    if (lane == 0) scales[g * n_pad + t] = 1.0f;
    return;
  }
  const float* in = x + t * cols + c0;
  float v[kFp8ScaleBlock / 32];
  float amax = 0.0f;
  for (int i = 0; i < kFp8ScaleBlock / 32; ++i) {
    const int c = lane + 32 * i;
    v[i] = c < width ? in[c] : 0.0f;
    amax = nan_max(fabsf(v[i]), amax);
  }
  for (int mask = 16; mask > 0; mask >>= 1) amax = nan_max(__shfl_xor_sync(0xFFFFFFFFu, amax, mask), amax);
  const float scale = amax > 0.0f ? __fdiv_rn(amax, kFp8E4m3Max) : (amax == 0.0f ? 1.0f : amax);
  for (int i = 0; i < kFp8ScaleBlock / 32; ++i) {
    const int c = lane + 32 * i;
    if (c < width) out[c] = __nv_cvt_float_to_fp8(__fdiv_rn(v[i], scale), __NV_SATFINITE, __NV_E4M3);
  }
  if (lane == 0) scales[g * n_pad + t] = scale;
}

void check_lt(cublasStatus_t status, const char* what, const WeightMatrix& w, int64_t n_pad) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorKind::kInternal, std::string("cuBLASLt error in ") + what + " (FP8 block-scaled GEMM of a [" +
                                        std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] weight, " +
                                        std::to_string(n_pad) + " tokens): " + cublasLtGetStatusName(status) + " (" +
                                        cublasLtGetStatusString(status) + ")");
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value, const char* what,
              const WeightMatrix& w, int64_t n_pad) {
  check_lt(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), what, w, n_pad);
}

}  // namespace

bool fp8_block_gemm_supported() {
  static const bool supported = [] {
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "cudaDeviceGetAttribute");
    return major == 9;
  }();
  return supported;
}

void launch_quantize_fp8_groups(const float* x, int64_t n, int64_t cols, uint8_t* codes, float* scales, cudaStream_t stream) {
  const int64_t n_pad = fp8_gemm_tokens(n), groups = fp8_blocks(cols), items = n_pad * groups;
  if (items == 0) return;
  const auto blocks = static_cast<unsigned>((items + kGroupWarps - 1) / kGroupWarps);
  quantize_fp8_groups_kernel<<<blocks, kGroupWarps * 32, 0, stream>>>(x, n, cols, n_pad, groups, codes, scales);
  check(cudaGetLastError(), "quantize_fp8_groups kernel");
}

Fp8Gemm::Fp8Gemm() {
  const cublasStatus_t status = cublasLtCreate(&handle_);
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorKind::kInternal, std::string("cuBLASLt error in cublasLtCreate: ") + cublasLtGetStatusName(status));
  }
}

Fp8Gemm::~Fp8Gemm() {
  for (auto& [shape, p] : plans_) destroy(p);
  if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
}

void Fp8Gemm::destroy(Plan& p) {
  if (p.d != nullptr) (void)cublasLtMatrixLayoutDestroy(p.d);
  if (p.b != nullptr) (void)cublasLtMatrixLayoutDestroy(p.b);
  if (p.a != nullptr) (void)cublasLtMatrixLayoutDestroy(p.a);
  if (p.desc != nullptr) (void)cublasLtMatmulDescDestroy(p.desc);
}

Fp8Gemm::Plan& Fp8Gemm::plan(const WeightMatrix& w, const float* a_scales, const float* b_scales, int64_t n_pad,
                             size_t workspace_bytes) {
  const auto key = std::make_tuple(w.rows, w.cols, n_pad, workspace_bytes);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan p;
  // Column-major throughout: D [rows, n_pad] (ld rows: row-major out [n_pad, rows]) = op(A) . B with A the weight
  // stored [cols, rows] (ld cols: its row-major [rows, cols]) and op(A) = A^T, B the codes [cols, n_pad] (ld cols).
  // The weight's scales: K-major, ceil(cols / 128) per block row at a stride that is a multiple of 4 (BlockScales::stride,
  // fp8_scale_stride), ceil(rows / 128) block rows; the activations': N-major [ceil(cols / 128), n_pad].
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    check_lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", w, n_pad);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(CUBLAS_OP_T), "TRANSA", w, n_pad);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(CUBLAS_OP_N), "TRANSB", w, n_pad);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F),
             "A_SCALE_MODE", w, n_pad);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F),
             "B_SCALE_MODE", w, n_pad);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(a_scales), "A_SCALE_POINTER", w, n_pad);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(b_scales), "B_SCALE_POINTER", w, n_pad);
    const auto rows = static_cast<uint64_t>(w.rows), cols = static_cast<uint64_t>(w.cols), tokens = static_cast<uint64_t>(n_pad);
    check_lt(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, cols, rows, static_cast<int64_t>(cols)), "A layout", w, n_pad);
    check_lt(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, cols, tokens, static_cast<int64_t>(cols)), "B layout", w, n_pad);
    check_lt(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, rows, tokens, static_cast<int64_t>(rows)), "D layout", w, n_pad);
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", w, n_pad);
    const auto max_workspace = static_cast<uint64_t>(workspace_bytes);
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                  sizeof(max_workspace)),
             "MAX_WORKSPACE_BYTES", w, n_pad);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found),
             "cublasLtMatmulAlgoGetHeuristic", w, n_pad);
    if (found == 0) check_lt(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic (no algorithm)", w, n_pad);
    p.algo = result.algo;
    (void)cublasLtMatmulPreferenceDestroy(pref);
  } catch (...) {
    if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
    destroy(p);
    throw;
  }
  return plans_.emplace(key, p).first->second;
}

std::string Fp8Gemm::unsupported_reason(int64_t rows, int64_t cols, const void* stand_in, size_t workspace_bytes) {
  const auto* scales = static_cast<const float*>(stand_in);
  const WeightMatrix w{stand_in, DType::kFP8_E4M3_B128, rows, cols, cols, BlockScales{scales, fp8_scale_stride(cols), 0}};
  try {
    plan(w, scales, scales, fp8_gemm_tokens(1), workspace_bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void Fp8Gemm::run(const WeightMatrix& w, const uint8_t* codes, const float* scales, int64_t n_pad, float* out,
                  void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  std::string problem = fp8_gemm_shape_problem(w.rows, w.cols, w.scales.row_offset);
  if (w.type != DType::kFP8_E4M3_B128 || w.row_bytes != w.cols) problem = "not packed block-scaled FP8 rows";
  if (w.scales.stride != fp8_scale_stride(w.cols)) problem = "scale rows not fp8_scale_stride floats apart";
  if (n_pad % 4 != 0) problem = "a token count not padded to a multiple of 4";
  if (!problem.empty()) {
    throw Error(ErrorKind::kInternal, "FP8 GEMM of a [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                                          "] matrix: " + problem + " (the loader stores such matrices as bf16)");
  }
  Plan& p = plan(w, w.scales.data, scales, n_pad, workspace_bytes);
  // The descriptor is shared by every weight of this shape: this call's scale pointers go in before the call (the
  // matmul reads them when it is enqueued, so a graph capture records these).
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w.scales.data), "A_SCALE_POINTER", w, n_pad);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(scales), "B_SCALE_POINTER", w, n_pad);
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(handle_, p.desc, &alpha, w.data, p.a, codes, p.b, &beta, out, p.d, out, p.d, &p.algo, workspace,
                          workspace_bytes, stream),
           "cublasLtMatmul", w, n_pad);
}

}  // namespace servetune::gpu

#endif  // !SERVETUNE_HIP
