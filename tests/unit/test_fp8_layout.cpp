// The host side of the GPU's FP8 GEMM (backend/fp8_layout.h): the weights' scale grid packed at 16-byte strides from
// the checkpoint's [ceil(rows / 128), ceil(cols / 128)] (row slices included), the shapes cuBLASLt's block-scaled FP8
// GEMM takes, and the activations' 1x128 per-token-group quantization (group amax / 448, codes = core's e4m3 of
// value / scale, N-major scales, padded tokens) against an independent computation with core's FP8 conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/fp8_layout.h"
#include "core/half.h"

namespace servetune {
namespace {

TEST(Fp8Layout, ScaleStrideIsTheBlockCountRoundedUpToFour) {
  EXPECT_EQ(fp8_scale_stride(64), 4);     // one partial block
  EXPECT_EQ(fp8_scale_stride(128), 4);
  EXPECT_EQ(fp8_scale_stride(512), 4);
  EXPECT_EQ(fp8_scale_stride(640), 8);    // 5 blocks
  EXPECT_EQ(fp8_scale_stride(2048), 16);
  EXPECT_EQ(fp8_scale_stride(7168), 56);  // DeepSeek-V3's hidden size: 56 blocks
  EXPECT_EQ(fp8_scale_stride(18432), 144);
}

TEST(Fp8Layout, PackedScalesKeepEveryBlockAtItsPlaceAndZeroThePadding) {
  // A checkpoint grid of 5 x 3 blocks ([576, 320]: partial last blocks both ways), value = 10 * block row + block col.
  const int64_t rows = 576, cols = 320, block_rows = 5, block_cols = 3;
  std::vector<float> grid(static_cast<size_t>(block_rows * block_cols));
  for (int64_t r = 0; r < block_rows; ++r)
    for (int64_t c = 0; c < block_cols; ++c) grid[static_cast<size_t>(r * block_cols + c)] = static_cast<float>(10 * r + c + 1);
  const std::vector<float> packed = pack_block_scales({grid.data(), block_cols, 0}, rows, cols);
  const int64_t stride = fp8_scale_stride(cols);
  ASSERT_EQ(stride, 4);
  ASSERT_EQ(packed.size(), static_cast<size_t>(block_rows * stride));
  const BlockScales view{packed.data(), stride, 0};
  for (int64_t r = 0; r < rows; r += 17) {
    for (int64_t c = 0; c < cols; c += 13) {
      EXPECT_EQ(view.at(r, c), grid[static_cast<size_t>(r / 128 * block_cols + c / 128)]) << r << ", " << c;
    }
  }
  for (int64_t r = 0; r < block_rows; ++r) EXPECT_EQ(packed[static_cast<size_t>(r * stride + 3)], 0.0f) << "padding of row " << r;
  // cuBLASLt's view of the same floats: K-major, element (k block kb, m block mb) at mb * stride + kb.
  for (int64_t mb = 0; mb < block_rows; ++mb)
    for (int64_t kb = 0; kb < block_cols; ++kb)
      EXPECT_EQ(packed[static_cast<size_t>(mb * stride + kb)], static_cast<float>(10 * mb + kb + 1));
}

TEST(Fp8Layout, PackedScalesOfARowSliceStartAtItsFirstBlockRow) {
  const int64_t cols = 256, block_cols = 2;
  std::vector<float> grid = {1, 2, 3, 4, 5, 6, 7, 8};  // 4 block rows of a [512, 256] matrix
  // Rows [200, 460): block rows 1..3, row offset 72 (as WeightLoader::matrix_rows builds it).
  const BlockScales host{grid.data() + 200 / 128 * block_cols, block_cols, 200 % 128};
  const std::vector<float> packed = pack_block_scales(host, 260, cols);
  ASSERT_EQ(packed.size(), 3u * 4u);
  EXPECT_EQ((std::vector<float>{packed[0], packed[1], packed[4], packed[5], packed[8], packed[9]}),
            (std::vector<float>{3, 4, 5, 6, 7, 8}));
  const BlockScales view{packed.data(), fp8_scale_stride(cols), host.row_offset};
  EXPECT_EQ(view.at(0, 0), 3.0f);    // row 200
  EXPECT_EQ(view.at(55, 200), 4.0f);  // row 255
  EXPECT_EQ(view.at(56, 0), 5.0f);    // row 256
  EXPECT_EQ(view.at(259, 255), 8.0f);  // row 459
}

TEST(Fp8Layout, GemmShapesFollowCublasLtsRules) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7168, 2048}, {2048, 7168}, {576, 7168}, {24576, 1536},
                            {32768, 512}, {40, 64}, {8, 64}, {96, 32}}) {
    EXPECT_EQ(fp8_gemm_shape_problem(rows, cols, 0), "") << rows << " x " << cols;
  }
  EXPECT_NE(fp8_gemm_shape_problem(128, 72, 0).find("72 columns are not a multiple of 16"), std::string::npos);
  EXPECT_NE(fp8_gemm_shape_problem(130, 128, 0).find("130 rows are not a multiple of 4"), std::string::npos);
  EXPECT_NE(fp8_gemm_shape_problem(64, 128, 32).find("32 rows into a 128-row scale block"), std::string::npos);
  EXPECT_EQ(fp8_gemm_tokens(1), 4);
  EXPECT_EQ(fp8_gemm_tokens(16), 16);
  EXPECT_EQ(fp8_gemm_tokens(301), 304);
}

TEST(Fp8Layout, GroupQuantizationMatchesCoresE4m3OfValueOverScale) {
  const int64_t n = 5, cols = 320;  // 3 groups, the last of 64 columns; 5 tokens padded to 8
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
  for (int64_t c = 128; c < 256; ++c) x[static_cast<size_t>(2 * cols + c)] = 0.0f;  // an all-zero group
  x[static_cast<size_t>(3 * cols + 5)] = -1e30f;                                    // one huge value in its group
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  quantize_fp8_groups(x.data(), n, cols, codes, scales);
  const int64_t n_pad = 8, groups = 3;
  ASSERT_EQ(codes.size(), static_cast<size_t>(n_pad * cols));
  ASSERT_EQ(scales.size(), static_cast<size_t>(groups * n_pad));
  for (int64_t t = 0; t < n_pad; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * 128, c1 = std::min<int64_t>(cols, c0 + 128);
      const float scale = scales[static_cast<size_t>(g * n_pad + t)];  // N-major: a group's tokens contiguous
      if (t >= n) {
        EXPECT_EQ(scale, 1.0f);
        for (int64_t c = c0; c < c1; ++c) EXPECT_EQ(codes[static_cast<size_t>(t * cols + c)], 0);
        continue;
      }
      double amax = 0.0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(static_cast<double>(x[static_cast<size_t>(t * cols + c)])));
      EXPECT_EQ(scale, amax == 0.0 ? 1.0f : static_cast<float>(amax) / 448.0f) << "token " << t << ", group " << g;
      float largest = 0.0f;
      for (int64_t c = c0; c < c1; ++c) {
        const float v = x[static_cast<size_t>(t * cols + c)];
        const uint8_t code = codes[static_cast<size_t>(t * cols + c)];
        ASSERT_EQ(code, f32_to_fp8_e4m3(v / scale)) << "token " << t << ", column " << c;
        const float back = fp8_e4m3_to_f32(code) * scale;
        largest = std::max(largest, std::fabs(fp8_e4m3_to_f32(code)));
        // e4m3 keeps 3 mantissa bits: a normal value comes back within 2^-4 of itself; the group's smallest values
        // (below 2^-6 of the scale, e4m3's subnormals) within half a subnormal step, 2^-10 of the scale.
        EXPECT_LE(std::fabs(back - v), std::max(std::fabs(v) * 0.0625f, scale * 0.0009765625f) * 1.0001f)
            << "token " << t << ", column " << c;
      }
      if (amax > 0.0) {
        EXPECT_EQ(largest, 448.0f) << "the group's largest value maps to e4m3's largest";
      }
    }
  }
}

TEST(Fp8Layout, NonFiniteActivationsReachTheOutput) {
  std::vector<float> x(128, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  quantize_fp8_groups(x.data(), 1, 128, codes, scales);
  EXPECT_TRUE(std::isnan(scales[0]));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(codes[0])));
  x[3] = std::numeric_limits<float>::infinity();
  quantize_fp8_groups(x.data(), 1, 128, codes, scales);
  EXPECT_TRUE(std::isinf(scales[0]));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(codes[3])) || std::isinf(fp8_e4m3_to_f32(codes[3]) * scales[0]));
}

}  // namespace
}  // namespace servetune
