// Block-scaled FP8 (FP8_E4M3_B128) CPU matmul: every ISA's kernel against the float64 product of the dequantized
// matrix and, bit for bit, against the same ISA's F32 matmul of that matrix (partial blocks, row slices that start
// mid-block, padded rows and scale rows, token counts around the tiles); outputs independent of the batch and thread
// count; bad scales and embedding lookups rejected clearly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"

namespace servetune::cpu {
namespace {

std::vector<CpuIsa> available_isas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kReference, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (cpu_supports(isa)) isas.push_back(isa);
  }
  return isas;
}

// An FP8_E4M3_B128 matrix with its scales, and the same matrix dequantized to f32.
struct Fp8Matrix {
  int64_t rows = 0, cols = 0, row_bytes = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // block rows of `scale_stride`
  int64_t scale_stride = 0;
  std::vector<float> dequant;  // rows × cols

  MatrixView view() const {
    return {codes.data(), DType::kFP8_E4M3_B128, rows, cols, row_bytes, {scales.data(), scale_stride, 0}};
  }
  MatrixView f32_view() const { return {dequant.data(), DType::kF32, rows, cols, cols * 4}; }
  // Rows [first, first + n) as a slice: its scales keep the block grid through the row offset.
  MatrixView rows_view(int64_t first, int64_t n) const {
    const BlockScales s{scales.data() + first / kFp8ScaleBlock * scale_stride, scale_stride, first % kFp8ScaleBlock};
    return {codes.data() + first * row_bytes, DType::kFP8_E4M3_B128, n, cols, row_bytes, s};
  }
};

// Codes from values of varied magnitude (subnormal, saturated, zero and negative zero among them) and scales that
// differ by block (powers of two apart and not), with `extra_row_bytes` of padding after each row and
// `extra_scales` after each scale row.
Fp8Matrix make_fp8_matrix(int64_t rows, int64_t cols, uint32_t seed, int64_t extra_row_bytes = 0, int64_t extra_scales = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 40.0f);
  std::uniform_real_distribution<float> uniform(0.5f, 2.0f);
  Fp8Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = cols + extra_row_bytes;
  m.codes.assign(static_cast<size_t>(rows * m.row_bytes), 0x7F);  // padding: NaN codes the kernels must not read
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      uint8_t code = f32_to_fp8_e4m3(normal(rng));
      const int64_t i = r * cols + c;
      if (i % 89 == 7) code = 0x01;   // smallest subnormal
      if (i % 97 == 11) code = 0x7E;  // 448
      if (i % 101 == 13) code = 0xFE;
      if (i % 103 == 17) code = 0x80;  // -0
      m.codes[static_cast<size_t>(r * m.row_bytes + c)] = code;
    }
  }
  const int64_t block_rows = (rows + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const int64_t block_cols = (cols + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  m.scale_stride = block_cols + extra_scales;
  m.scales.assign(static_cast<size_t>(block_rows * m.scale_stride), std::nanf(""));
  for (int64_t br = 0; br < block_rows; ++br) {
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      const float s = (br + bc) % 3 == 0 ? std::ldexp(1.0f, -9 - static_cast<int>(bc % 4)) : uniform(rng) * 1e-3f;
      m.scales[static_cast<size_t>(br * m.scale_stride + bc)] = s;
    }
  }
  m.dequant.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_fp8_block_row(m.codes.data() + r * m.row_bytes, m.scales.data() + r / kFp8ScaleBlock * m.scale_stride,
                             m.dequant.data() + r * cols, cols);
  }
  return m;
}

std::vector<float> random_activations(int64_t n_tokens, int64_t stride, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n_tokens * stride));
  for (float& v : x) v = normal(rng);
  return x;
}

// The exact product code · scale of each weight times x in float64, and the magnitude of its terms.
void expect_near_exact(const Fp8Matrix& m, const float* x, int64_t x_stride, int64_t n_tokens, const float* y,
                       int64_t y_stride) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < m.rows; ++r) {
      double want = 0, magnitude = 0;
      for (int64_t c = 0; c < m.cols; ++c) {
        const double w = static_cast<double>(fp8_e4m3_to_f32(m.codes[static_cast<size_t>(r * m.row_bytes + c)])) *
                         m.scales[static_cast<size_t>(r / kFp8ScaleBlock * m.scale_stride + c / kFp8ScaleBlock)];
        want += w * x[t * x_stride + c];
        magnitude += std::fabs(w * x[t * x_stride + c]);
      }
      ASSERT_NEAR(y[t * y_stride + r], want, 1e-5 * magnitude + 1e-30) << "t=" << t << " r=" << r;
    }
  }
}

struct Case {
  int64_t rows, cols;
  int64_t extra_row_bytes, extra_scales;
};

// Partial blocks both ways (300 × 260), a column tail off the 16- and 8-wide vectors (1000, 129, 7), exact blocks,
// single rows and columns, padded rows and scale rows; rows longer than one 512-column panel of the batched tiles
// (600, 1000, and 1030, whose last panel is only the 6-column tail).
const Case kCases[] = {{300, 260, 0, 0}, {300, 260, 5, 2}, {130, 128, 0, 0}, {67, 129, 3, 1}, {20, 1000, 0, 0},
                       {13, 600, 2, 1},  {7, 1030, 0, 0},  {9, 7, 0, 0},     {1, 1, 0, 0},    {5, 16, 0, 0}};

TEST(CpuMatmulFp8, MatchesDequantizedF32BitForBitOnEveryIsa) {
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    const Fp8Matrix m = make_fp8_matrix(c.rows, c.cols, seed++, c.extra_row_bytes, c.extra_scales);
    for (int64_t n_tokens : {1, 3, 17, 64}) {
      SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " tokens=" + std::to_string(n_tokens));
      const int64_t x_stride = c.cols + 3, y_stride = c.rows + 5;
      const std::vector<float> x = random_activations(n_tokens, x_stride, seed++);
      for (CpuIsa isa : available_isas()) {
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
          SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " threads=" + std::to_string(threads));
          ThreadPool pool(threads);
          const float kSentinel = -12345.0f;
          std::vector<float> y(static_cast<size_t>(n_tokens * y_stride), kSentinel), f32(y.size(), kSentinel);
          matmul_with_isa(isa, m.view(), x.data(), n_tokens, x_stride, y.data(), y_stride, pool);
          expect_near_exact(m, x.data(), x_stride, n_tokens, y.data(), y_stride);
          matmul_with_isa(isa, m.f32_view(), x.data(), n_tokens, x_stride, f32.data(), y_stride, pool);
          ASSERT_EQ(std::memcmp(y.data(), f32.data(), y.size() * sizeof(float)), 0) << "differs from F32 dequantized";
          if (first.empty()) first = y;
          ASSERT_EQ(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)), 0) << "depends on threads";
        }
      }
    }
  }
}

// A tensor-parallel row slice starting inside a scale block reads its scales through the row offset: the same bits
// as those rows of the whole matrix.
TEST(CpuMatmulFp8, RowSliceStartingMidBlockMatchesWholeMatrix) {
  const Fp8Matrix m = make_fp8_matrix(300, 260, 7);
  const int64_t n_tokens = 5;
  const std::vector<float> x = random_activations(n_tokens, 260, 8);
  for (CpuIsa isa : available_isas()) {
    ThreadPool pool(2);
    std::vector<float> whole(static_cast<size_t>(n_tokens * 300));
    matmul_with_isa(isa, m.view(), x.data(), n_tokens, 260, whole.data(), 300, pool);
    for (const auto& [first, n] : {std::pair<int64_t, int64_t>{150, 150}, {100, 100}, {127, 2}, {128, 172}, {0, 1}}) {
      std::vector<float> part(static_cast<size_t>(n_tokens * n));
      matmul_with_isa(isa, m.rows_view(first, n), x.data(), n_tokens, 260, part.data(), n, pool);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const size_t bytes = static_cast<size_t>(n) * sizeof(float);
        ASSERT_EQ(std::memcmp(part.data() + t * n, whole.data() + t * 300 + first, bytes), 0)
            << cpu_isa_name(isa) << " rows [" << first << ", " << first + n << ") token " << t;
      }
    }
  }
}

// The engine's greedy output must not depend on what else is in the batch: on-the-fly tiles (few tokens) and
// dequantized panels (more) compute the same bits.
TEST(CpuMatmulFp8, OutputsIndependentOfBatch) {
  const int64_t rows = 37, cols = 700, n_tokens = 56;  // two column panels
  const Fp8Matrix m = make_fp8_matrix(rows, cols, 21);
  const std::vector<float> x = random_activations(n_tokens, cols, 22);
  for (CpuIsa isa : available_isas()) {
    SCOPED_TRACE(cpu_isa_name(isa));
    ThreadPool pool1(1), pool2(2);
    std::vector<float> all(static_cast<size_t>(n_tokens * rows));
    matmul_with_isa(isa, m.view(), x.data(), n_tokens, cols, all.data(), rows, pool2);
    const int64_t ranges[][2] = {{0, 1}, {5, 26}, {3, 7}, {16, 33}, {0, 17}, {39, 40}, {8, 40}, {0, 3}};
    for (const auto& range : ranges) {
      for (ThreadPool* pool : {&pool1, &pool2}) {
        const int64_t n = range[1] - range[0];
        std::vector<float> part(static_cast<size_t>(n * rows));
        matmul_with_isa(isa, m.view(), x.data() + range[0] * cols, n, cols, part.data(), rows, *pool);
        ASSERT_EQ(std::memcmp(part.data(), all.data() + range[0] * rows, part.size() * sizeof(float)), 0)
            << "tokens [" << range[0] << ", " << range[1] << ") threads=" << pool->size();
      }
    }
  }
}

// matmul_multi (FP8 next to F32: both read f32 activations) and matmul_swiglu equal their separate calls.
TEST(CpuMatmulFp8, MultiAndSwigluMatchSeparateCalls) {
  const Fp8Matrix a = make_fp8_matrix(40, 256, 31), b = make_fp8_matrix(9, 256, 32);
  ThreadPool pool(2);
  for (int64_t n_tokens : {1, 20}) {
    const std::vector<float> x = random_activations(n_tokens, 2 * 256, 33);
    std::vector<float> ya(static_cast<size_t>(n_tokens * 40)), yb(static_cast<size_t>(n_tokens * 9));
    const MatmulTarget targets[] = {{a.view(), ya.data(), 40}, {b.f32_view(), yb.data(), 9}};
    matmul_multi(targets, 2, x.data(), n_tokens, 2 * 256, pool);
    for (const MatmulTarget& t : targets) {
      std::vector<float> want(static_cast<size_t>(n_tokens * t.w.rows));
      matmul(t.w, x.data(), n_tokens, 2 * 256, want.data(), t.w.rows, pool);
      EXPECT_EQ(std::memcmp(want.data(), t.y, want.size() * sizeof(float)), 0) << n_tokens;
    }
    // SwiGLU of x's two halves as gate and up.
    const SiluMulKernel silu_mul = [](const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn,
                                      float* out) {
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < ffn; ++i) {
          const float g = gate[t * in_stride + i];
          out[t * ffn + i] = g / (1.0f + std::exp(-g)) * up[t * in_stride + i];
        }
      }
    };
    std::vector<float> rows(static_cast<size_t>(n_tokens * 256)), written(rows.size());
    silu_mul(x.data(), x.data() + 256, 512, n_tokens, 256, rows.data());
    std::vector<float> want(static_cast<size_t>(n_tokens * 40)), got(want.size());
    matmul(a.view(), rows.data(), n_tokens, 256, want.data(), 40, pool);
    matmul_swiglu(a.view(), {x.data(), x.data() + 256, 512, silu_mul}, n_tokens, written.data(), got.data(), 40, pool);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << n_tokens;
  }
}

// A NaN code (S.1111.111) makes its row's outputs NaN on every ISA, as it does in the dequantized matrix.
TEST(CpuMatmulFp8, NanCodePropagates) {
  Fp8Matrix m = make_fp8_matrix(6, 40, 41);
  m.codes[static_cast<size_t>(2 * m.row_bytes + 33)] = 0xFF;
  const std::vector<float> x = random_activations(3, 40, 42);
  for (CpuIsa isa : available_isas()) {
    ThreadPool pool(1);
    std::vector<float> y(18);
    matmul_with_isa(isa, m.view(), x.data(), 3, 40, y.data(), 6, pool);
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t r = 0; r < 6; ++r) {
        EXPECT_EQ(std::isnan(y[static_cast<size_t>(t * 6 + r)]), r == 2) << cpu_isa_name(isa) << " t=" << t << " r=" << r;
      }
    }
  }
}

TEST(CpuMatmulFp8, MissingOrShortScalesAreUsageErrors) {
  const Fp8Matrix m = make_fp8_matrix(4, 300, 51);
  ThreadPool pool(1);
  std::vector<float> x(300), y(4);
  EXPECT_TRUE(matmul_supports(DType::kFP8_E4M3_B128));
  MatrixView v = m.view();
  v.scales.data = nullptr;
  EXPECT_THROW(matmul(v, x.data(), 1, 300, y.data(), 4, pool), Error);
  v = m.view();
  v.scales.stride = 2;  // 300 columns need 3 scales a block row
  try {
    matmul(v, x.data(), 1, 300, y.data(), 4, pool);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("block scales"), std::string::npos) << e.what();
  }
  v = m.view();
  v.scales.row_offset = 128;
  EXPECT_THROW(matmul(v, x.data(), 1, 300, y.data(), 4, pool), Error);
}

TEST(CpuMatmulFp8, EmbeddingLookupIsUnsupported) {
  const Fp8Matrix m = make_fp8_matrix(4, 64, 61);
  CpuBackend backend(1);
  const WeightMatrix table{m.codes.data(), DType::kFP8_E4M3_B128, 4, 64, 64, {m.scales.data(), 1, 0}};
  const int32_t ids[] = {1};
  std::vector<float> out(64);
  try {
    backend.embed(table, ids, 1, out.data());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("FP8_E4M3_B128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune::cpu
