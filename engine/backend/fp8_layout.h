// Host-side layout and arithmetic of the FP8 (e4m3) GEMMs with 128x128 block-scaled weights (kFP8_E4M3_B128):
// the weights' scale grid as the loader places it for every backend (rows of ceil(cols / 128) scales, 16-byte
// strides: the layout cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F reads), the shapes the GPU's cuBLASLt
// FP8 GEMM takes, and the activations' 1x128 per-token-group quantization (DeepSeek-V3's, DeepGEMM's and vLLM's
// scheme) that the GPU kernel computes, spelled out here so a CPU test can check it against core's FP8 conversion.
// Header-only, plain C++ (no CUDA), so the ci preset builds and tests it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"

namespace servetune {

// The largest finite e4m3 magnitude: a token group's largest |value| maps to it.
constexpr float kFp8E4m3Max = 448.0f;

inline int64_t fp8_blocks(int64_t n) { return (n + kFp8ScaleBlock - 1) / kFp8ScaleBlock; }
inline int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }

// Floats from one block row of a weight's scale grid to the next: ceil(cols / 128) rounded up to a multiple of 4.
// cuBLASLt's 128x128 mode reads the scales K-major (a block row's column blocks contiguous) with a 16-byte-multiple
// stride between block rows; the CPU kernels read any stride (BlockScales::stride).
inline int64_t fp8_scale_stride(int64_t cols) { return round_up4(fp8_blocks(cols)); }

// The scale rows that `rows` rows read from `host` (BlockScales::block_rows of them, ceil(cols / 128) scales each), packed
// at fp8_scale_stride(cols) floats per block row; the padding is zero.
inline std::vector<float> pack_block_scales(const BlockScales& host, int64_t rows, int64_t cols) {
  const int64_t block_cols = fp8_blocks(cols), stride = fp8_scale_stride(cols), block_rows = host.block_rows(rows);
  std::vector<float> packed(static_cast<size_t>(block_rows * stride), 0.0f);
  for (int64_t r = 0; r < block_rows; ++r) {
    std::copy_n(host.data + r * host.stride, block_cols, packed.begin() + r * stride);
  }
  return packed;
}

// Why cuBLASLt's block-scaled FP8 GEMM cannot take a [rows, cols] kFP8_E4M3_B128 matrix whose first row lies
// `row_offset` rows into its 128-row scale block, or "" when it can. The cuBLAS documentation (cublasLtMatmul, FP8;
// "Scaling factors layouts"): FP8 operands need 16-byte-aligned leading dimensions (cols % 16 with the weight's rows
// as K-contiguous columns of the transposed A), and M (= rows) must be a multiple of 4; the scale grid starts at row
// 0 (a slice that starts inside a block has no such grid). K and M need not be multiples of 128: the last blocks may
// be partial (L = ceil(K / 128) scales per row in the documented semantics).
inline std::string fp8_gemm_shape_problem(int64_t rows, int64_t cols, int64_t row_offset) {
  if (cols % 16 != 0) return std::to_string(cols) + " columns are not a multiple of 16";
  if (rows % 4 != 0) return std::to_string(rows) + " rows are not a multiple of 4";
  if (row_offset != 0) return "its rows start " + std::to_string(row_offset) + " rows into a 128-row scale block";
  return "";
}

// The activations' side. Tokens are padded to a multiple of 4 (cuBLASLt's block scaling needs N % 4 == 0); a token
// group is 128 columns of one token (the last one partial when cols % 128 != 0).
inline int64_t fp8_gemm_tokens(int64_t n) { return round_up4(n); }

// The dequantizing scale of a group whose largest |value| is `amax`: amax / 448 (all-zero groups take 1; a NaN or inf
// in the group gives NaN or inf, so the GEMM's output shows it).
inline float fp8_group_scale(float amax) { return amax > 0.0f ? amax / kFp8E4m3Max : (amax == 0.0f ? 1.0f : amax); }

// Host reference of the device quantization: x [n, cols] f32 row-major into codes [n_pad, cols] (e4m3 of x / scale,
// core's rounding: nearest even, saturating) and scales [ceil(cols / 128), n_pad] token-contiguous (the N-major
// layout of cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F for B); padded tokens get code 0 and scale 1.
inline void quantize_fp8_groups(const float* x, int64_t n, int64_t cols, std::vector<uint8_t>& codes, std::vector<float>& scales) {
  const int64_t n_pad = fp8_gemm_tokens(n), groups = fp8_blocks(cols);
  codes.assign(static_cast<size_t>(n_pad * cols), 0);
  scales.assign(static_cast<size_t>(groups * n_pad), 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * kFp8ScaleBlock, c1 = std::min(cols, c0 + kFp8ScaleBlock);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) {
        const float a = std::fabs(x[t * cols + c]);
        amax = std::isnan(a) || a > amax ? a : amax;  // NaN sticks (fmaxf would drop it)
        if (std::isnan(amax)) break;
      }
      const float scale = fp8_group_scale(amax);
      scales[static_cast<size_t>(g * n_pad + t)] = scale;
      for (int64_t c = c0; c < c1; ++c) codes[static_cast<size_t>(t * cols + c)] = f32_to_fp8_e4m3(x[t * cols + c] / scale);
    }
  }
}

}  // namespace servetune
