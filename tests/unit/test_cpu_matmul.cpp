// Tests for the CPU matmul: the activation quantizers agree bit for bit across ISAs; the reference implements the
// ggml scheme and approximates the float64 product; every ISA's kernels match the reference for every weight type on
// awkward shapes, identically for 1, 2 and 3 threads, without touching padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/background_prefetch.h"
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

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

// Activations with awkward content: an all-zero block, a block with one outlier, tiny and large blocks.
std::vector<float> random_activations(int64_t n_tokens, int64_t cols, int64_t stride, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(n_tokens * stride), std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> v = random_floats(n_tokens * cols, seed);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t c = 0; c < cols; ++c) {
      float f = v[static_cast<size_t>(t * cols + c)];
      const int64_t block = c / 32;
      if (block % 7 == 3) f = 0.0f;
      if (block % 7 == 5) f *= 1e-6f;
      if (block % 7 == 6 && c % 32 == 5) f = 40.0f;
      x[static_cast<size_t>(t * stride + c)] = f;
    }
  }
  return x;
}

struct TestMatrix {
  DType type;
  int64_t rows, cols, row_bytes;
  std::vector<uint8_t> data;
  std::vector<double> dequant;  // rows × cols
  MatrixView view() const { return {data.data(), type, rows, cols, row_bytes}; }
};

TestMatrix make_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed, int64_t extra_row_bytes = 0) {
  TestMatrix m{type, rows, cols, *dtype_row_bytes(type, cols) + extra_row_bytes, {}, {}};
  m.data.assign(static_cast<size_t>(m.row_bytes * rows), 0xA5);
  std::vector<float> w = random_floats(rows * cols, seed, 0.05f);
  for (int64_t r = 0; r < rows; ++r) {
    // Some rows with an offset, so Q4_1 mins matter, and a few extreme values.
    for (int64_t c = 0; c < cols; ++c) {
      float& f = w[static_cast<size_t>(r * cols + c)];
      if (r % 3 == 1) f += 0.03f;
      if ((r * cols + c) % 97 == 13) f *= 8.0f;
    }
    quantize_row(type, &w[static_cast<size_t>(r * cols)], m.data.data() + r * m.row_bytes, cols);
  }
  m.dequant.resize(static_cast<size_t>(rows * cols));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(type, m.data.data() + r * m.row_bytes, row.data(), cols);
    for (int64_t c = 0; c < cols; ++c) m.dequant[static_cast<size_t>(r * cols + c)] = row[static_cast<size_t>(c)];
  }
  return m;
}

bool is_quantized(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 || t == DType::kQ8_0;
}

// Exact (float64) value of the numerics contract for one output, and the magnitude of its terms.
struct Expected {
  double value = 0, magnitude = 0, dequant_value = 0, quant_error_bound = 0;
};

Expected expected_output(const TestMatrix& m, int64_t r, const float* x) {
  Expected e;
  const int64_t cols = m.cols;
  if (!is_quantized(m.type)) {
    const double rel = m.type == DType::kF16 ? std::ldexp(1.0, -11) : m.type == DType::kBF16 ? std::ldexp(1.0, -8) : 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double w = m.dequant[static_cast<size_t>(r * cols + c)];
      double xr = x[c];
      if (m.type == DType::kF16) xr = fp16_to_f32(f32_to_fp16(x[c]));
      if (m.type == DType::kBF16) xr = bf16_to_f32(f32_to_bf16(x[c]));
      e.value += w * xr;
      e.magnitude += std::fabs(w * xr);
      e.dequant_value += w * x[c];
      e.quant_error_bound += rel * std::fabs(w * x[c]);
    }
    return e;
  }
  const int64_t nb = cols / 32;
  std::vector<int8_t> q(static_cast<size_t>(cols));
  std::vector<float> d(static_cast<size_t>(nb)), s(static_cast<size_t>(nb));
  quantize_activations(CpuIsa::kReference, x, cols, q.data(), d.data(), s.data());
  const uint8_t* row = m.data.data() + r * m.row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    double wd = 0, wm = 0;
    int qw[32];
    if (m.type == DType::kQ8_0) {
      BlockQ8_0 blk;
      std::memcpy(&blk, row + b * sizeof blk, sizeof blk);
      wd = fp16_to_f32(blk.d);
      for (int j = 0; j < 32; ++j) qw[j] = blk.qs[j];
    } else if (m.type == DType::kQ4_0) {
      BlockQ4_0 blk;
      std::memcpy(&blk, row + b * sizeof blk, sizeof blk);
      wd = fp16_to_f32(blk.d);
      for (int j = 0; j < 16; ++j) {
        qw[j] = (blk.qs[j] & 15) - 8;
        qw[j + 16] = (blk.qs[j] >> 4) - 8;
      }
    } else if (m.type == DType::kQ4_1) {
      BlockQ4_1 blk;
      std::memcpy(&blk, row + b * sizeof blk, sizeof blk);
      wd = fp16_to_f32(blk.d);
      wm = fp16_to_f32(blk.m);
      for (int j = 0; j < 16; ++j) {
        qw[j] = blk.qs[j] & 15;
        qw[j + 16] = blk.qs[j] >> 4;
      }
    } else {
      // Q5_0 / Q5_1: low nibbles as Q4, fifth bit j of qh belongs to element j; Q5_0 is offset by 16.
      uint8_t qs[16];
      uint32_t qh;
      if (m.type == DType::kQ5_0) {
        BlockQ5_0 blk;
        std::memcpy(&blk, row + b * sizeof blk, sizeof blk);
        wd = fp16_to_f32(blk.d);
        std::memcpy(qs, blk.qs, 16);
        std::memcpy(&qh, blk.qh, 4);
      } else {
        BlockQ5_1 blk;
        std::memcpy(&blk, row + b * sizeof blk, sizeof blk);
        wd = fp16_to_f32(blk.d);
        wm = fp16_to_f32(blk.m);
        std::memcpy(qs, blk.qs, 16);
        std::memcpy(&qh, blk.qh, 4);
      }
      const int offset = m.type == DType::kQ5_0 ? 16 : 0;
      for (int j = 0; j < 16; ++j) {
        qw[j] = ((qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4)) - offset;
        qw[j + 16] = ((qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - offset;
      }
    }
    int64_t isum = 0, iabs = 0;
    double amax = 0, wabs = 0, xabs = 0;
    for (int j = 0; j < 32; ++j) {
      isum += qw[j] * q[static_cast<size_t>(b * 32 + j)];
      iabs += std::abs(qw[j] * q[static_cast<size_t>(b * 32 + j)]);
      const double xv = x[b * 32 + j];
      const double w = m.dequant[static_cast<size_t>(r * cols + b * 32 + j)];
      amax = std::max(amax, std::fabs(xv));
      wabs += std::fabs(w);
      xabs += std::fabs(xv);
      e.dequant_value += w * xv;
      e.quant_error_bound += std::fabs(w) * std::ldexp(std::fabs(xv), -10);
    }
    const double dx = d[static_cast<size_t>(b)];
    e.value += wd * dx * static_cast<double>(isum) + wm * s[static_cast<size_t>(b)];
    e.magnitude += std::fabs(wd * dx) * static_cast<double>(iabs) + std::fabs(wm * s[static_cast<size_t>(b)]);
    // Rounding x to q·d moves each element by at most d/2 (+ f16 rounding of d); the Q4_1 sum term by 16·d.
    e.quant_error_bound +=
        wabs * 0.5 * amax / 127.0 * 1.01 + std::fabs(wm) * (16.0 * amax / 127.0 * 1.01 + std::ldexp(xabs, -10));
  }
  return e;
}

struct Case {
  int64_t rows, cols, n_tokens;
};

std::string label(DType t, const Case& c) {
  return std::string(dtype_name(t)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
         " tokens=" + std::to_string(c.n_tokens);
}

void check_type(DType type, const std::vector<Case>& cases) {
  uint32_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(label(type, c));
    const TestMatrix m = make_matrix(type, c.rows, c.cols, seed++, c.rows % 2 == 1 ? 6 : 0);
    const int64_t x_stride = c.cols + 3;
    const int64_t y_stride = c.rows + 5;
    const std::vector<float> x = random_activations(c.n_tokens, c.cols, x_stride, seed++);
    const float kSentinel = -12345.0f;
    std::vector<float> ref(static_cast<size_t>(c.n_tokens * y_stride), kSentinel);
    matmul_reference(m.view(), x.data(), c.n_tokens, x_stride, ref.data(), y_stride);

    std::vector<Expected> expected(static_cast<size_t>(c.n_tokens * c.rows));
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      for (int64_t r = 0; r < c.rows; ++r) {
        const Expected e = expected_output(m, r, x.data() + t * x_stride);
        expected[static_cast<size_t>(t * c.rows + r)] = e;
        const float got = ref[static_cast<size_t>(t * y_stride + r)];
        ASSERT_NEAR(got, e.value, 1e-5 * e.magnitude + 1e-30) << "reference vs contract, t=" << t << " r=" << r;
        ASSERT_NEAR(got, e.dequant_value, e.quant_error_bound + 2e-5 * e.magnitude + 1e-30)
            << "reference vs float64 dequantized product, t=" << t << " r=" << r;
      }
      for (int64_t r = c.rows; r < y_stride; ++r) ASSERT_EQ(ref[static_cast<size_t>(t * y_stride + r)], kSentinel);
    }

    for (CpuIsa isa : available_isas()) {
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " threads=" + std::to_string(threads));
        ThreadPool pool(threads);
        std::vector<float> y(static_cast<size_t>(c.n_tokens * y_stride), kSentinel);
        matmul_with_isa(isa, m.view(), x.data(), c.n_tokens, x_stride, y.data(), y_stride, pool);
        for (int64_t t = 0; t < c.n_tokens; ++t) {
          for (int64_t r = 0; r < c.rows; ++r) {
            const size_t i = static_cast<size_t>(t * y_stride + r);
            ASSERT_NEAR(y[i], ref[i], 2e-5 * expected[static_cast<size_t>(t * c.rows + r)].magnitude + 1e-30)
                << "t=" << t << " r=" << r;
          }
          for (int64_t r = c.rows; r < y_stride; ++r) ASSERT_EQ(y[static_cast<size_t>(t * y_stride + r)], kSentinel);
        }
        // Quantized kernels all follow the canonical block arithmetic, which the reference spells out: bit for bit.
        if (is_quantized(type)) {
          ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)), 0) << "differs from the reference";
        }
        // Work splitting never changes an output's arithmetic, so results are bitwise independent of threads.
        if (first.empty()) {
          first = y;
        } else {
          ASSERT_EQ(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

// Awkward shapes: odd block counts (96, 4128 = 129 blocks), more than one 4096-column panel chunk (4160, 4128), row
// counts off the 4-row tile, token counts around the 4-token tile and the 16-token group (17, 33: a lone last token).
const std::vector<Case> kQuantCases = {
    {1, 32, 1},     {5, 64, 2},   {7, 96, 3},   {67, 576, 1}, {67, 576, 5},  {33, 1536, 17}, {130, 576, 33},
    {19, 160, 100}, {6, 4160, 3}, {9, 4128, 5}, {5, 4128, 1}, {6, 4160, 17}, {192, 576, 4},  {40, 2080, 8},
    {19, 4160, 150},  // more activations than one work chunk caches: split into token chunks
};
const std::vector<Case> kFloatCases = {
    {1, 1, 1},     {3, 7, 2},      {5, 17, 3},   {67, 64, 5},  {9, 172, 17},
    {33, 576, 33}, {18, 100, 100}, {70, 288, 1}, {4, 1536, 4}, {11, 33, 9}, {5, 4096, 40},
};

TEST(CpuMatmul, Q4_1MatchesReference) { check_type(DType::kQ4_1, kQuantCases); }
TEST(CpuMatmul, Q4_0MatchesReference) { check_type(DType::kQ4_0, kQuantCases); }
TEST(CpuMatmul, Q8_0MatchesReference) { check_type(DType::kQ8_0, kQuantCases); }
TEST(CpuMatmul, Q5_0MatchesReference) { check_type(DType::kQ5_0, kQuantCases); }
TEST(CpuMatmul, Q5_1MatchesReference) { check_type(DType::kQ5_1, kQuantCases); }
// Integer sums at their limits: every code at its extreme (Q4 nibbles 15, Q5 codes 31, Q8_0 -128 / 127) against
// activations that all quantize to +127 or all to -127, over 35 tokens (two token-lane groups and three more). The
// AVX2 kernels keep pair sums in 16 bits for several quads (token lanes) or tree levels (row octets); any overflow or
// saturation shows here as a mismatch.
TEST(CpuMatmul, ExtremeCodesMatchReference) {
  const int64_t rows = 18, cols = 256, n_tokens = 35;
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(t * cols + c)] = (t % 2 == 0 ? 1.0f : -1.0f) * 0.5f;
  }
  for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    const int64_t block_bytes = dtype_info(type).type_size;
    const int64_t row_bytes = *dtype_row_bytes(type, cols);
    std::vector<uint8_t> w(static_cast<size_t>(rows * row_bytes));
    const uint16_t one = f32_to_fp16(1.0f), half = f32_to_fp16(0.5f);
    for (int64_t off = 0, i = 0; off < static_cast<int64_t>(w.size()); off += block_bytes, ++i) {
      uint8_t* blk = &w[static_cast<size_t>(off)];
      std::memcpy(blk, &one, 2);
      if (type == DType::kQ8_0) {
        std::memset(blk + 2, i % 2 == 0 ? 0x80 : 0x7F, 32);  // -128 or 127
        continue;
      }
      int64_t qs = 2;
      if (type == DType::kQ4_1 || type == DType::kQ5_1) {
        std::memcpy(blk + 2, &half, 2);
        qs = 4;
      }
      if (type == DType::kQ5_0 || type == DType::kQ5_1) {
        std::memset(blk + qs, 0xFF, 4);
        qs += 4;
      }
      std::memset(blk + qs, 0xFF, 16);
    }
    const MatrixView view{w.data(), type, rows, cols, row_bytes};
    std::vector<float> ref(static_cast<size_t>(n_tokens * rows));
    matmul_reference(view, x.data(), n_tokens, cols, ref.data(), rows);
    for (CpuIsa isa : available_isas()) {
      SCOPED_TRACE(std::string(cpu_isa_name(isa)));
      ThreadPool pool(2);
      std::vector<float> y(ref.size());
      matmul_with_isa(isa, view, x.data(), n_tokens, cols, y.data(), rows, pool);
      ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)), 0) << "differs from the reference";
    }
  }
}

TEST(CpuMatmul, F32MatchesReference) { check_type(DType::kF32, kFloatCases); }
TEST(CpuMatmul, F16MatchesReference) { check_type(DType::kF16, kFloatCases); }
TEST(CpuMatmul, BF16MatchesReference) { check_type(DType::kBF16, kFloatCases); }

// Random k-quant rows: random bytes with sane f16 super-block scales (d and dmin first for Q4_K, Q5_K; last for
// Q2_K; d last for Q3_K, Q6_K).
TestMatrix make_k_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  TestMatrix m{type, rows, cols, *dtype_row_bytes(type, cols), {}, {}};
  std::mt19937 rng(seed);
  m.data.resize(static_cast<size_t>(m.row_bytes * rows));
  for (uint8_t& b : m.data) b = static_cast<uint8_t>(rng());
  const int64_t block_bytes = dtype_info(type).type_size;
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  for (int64_t off = 0; off < static_cast<int64_t>(m.data.size()); off += block_bytes) {
    const uint16_t d = f32_to_fp16(scale(rng)), dmin = f32_to_fp16(scale(rng));
    uint8_t* blk = &m.data[static_cast<size_t>(off)];
    if (type == DType::kQ4_K || type == DType::kQ5_K) {
      std::memcpy(blk, &d, 2);
      std::memcpy(blk + 2, &dmin, 2);
    } else if (type == DType::kQ2_K) {
      std::memcpy(blk + block_bytes - 4, &d, 2);
      std::memcpy(blk + block_bytes - 2, &dmin, 2);
    } else {
      std::memcpy(blk + block_bytes - 2, &d, 2);
    }
  }
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(type, m.data.data() + r * m.row_bytes, row.data(), cols);
    m.dequant.insert(m.dequant.end(), row.begin(), row.end());
  }
  return m;
}

// Weight types without a dedicated kernel: dequantized rows, f32 dots against unquantized activations.
TEST(CpuMatmul, DequantizeFallbackTypes) {
  for (DType type : {DType::kQ2_K, DType::kQ3_K}) {
    if (!can_dequantize(type)) continue;
    SCOPED_TRACE(std::string(dtype_name(type)));
    const int64_t rows = 6, cols = 512, n_tokens = 3;
    const TestMatrix m = make_k_matrix(type, rows, cols, 9);
    ASSERT_TRUE(matmul_supports(type));
    const std::vector<float> x = random_activations(n_tokens, cols, cols, 6);
    for (CpuIsa isa : available_isas()) {
      ThreadPool pool(2);
      std::vector<float> y(static_cast<size_t>(n_tokens * rows));
      matmul_with_isa(isa, m.view(), x.data(), n_tokens, cols, y.data(), rows, pool);
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double want = 0, magnitude = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double p = m.dequant[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(t * cols + c)];
            want += p;
            magnitude += std::fabs(p);
          }
          EXPECT_NEAR(y[static_cast<size_t>(t * rows + r)], want, 1e-5 * magnitude + 1e-30) << cpu_isa_name(isa);
        }
      }
    }
  }
}

// Q8_K activations of one token as the kernels see them (the reference quantizer), dequantized: d·q per element.
std::vector<double> q8k_values(const float* x, int64_t cols) {
  std::vector<int8_t> q(static_cast<size_t>(cols));
  std::vector<float> d(static_cast<size_t>(cols / 256));
  std::vector<int16_t> bsums(static_cast<size_t>(cols / 16));
  quantize_activations_q8k(CpuIsa::kReference, x, cols, q.data(), d.data(), bsums.data());
  std::vector<double> v(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(c)] = static_cast<double>(d[c / 256]) * q[c];
  return v;
}

// The reference implements the k-quant contract: within f32 rounding of Σ w·(d_x·q_x) over the dequantized weights and
// Q8_K activations, and within the activation rounding of the float64 product with the f32 activations. Every ISA's
// kernels (row tiles for odd token counts, token lanes for whole 16-token groups) give its bits, on 1, 2 and 3
// threads, without writing past the rows.
void check_k_type(DType type, const std::vector<Case>& cases) {
  ASSERT_TRUE(matmul_supports(type));
  uint32_t seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(label(type, c));
    const TestMatrix m = make_k_matrix(type, c.rows, c.cols, seed++);
    const int64_t x_stride = c.cols + 1;
    const int64_t y_stride = c.rows + 3;
    const std::vector<float> x = random_activations(c.n_tokens, c.cols, x_stride, seed++);
    const float kSentinel = -12345.0f;
    std::vector<float> ref(static_cast<size_t>(c.n_tokens * y_stride), kSentinel);
    matmul_reference(m.view(), x.data(), c.n_tokens, x_stride, ref.data(), y_stride);
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      const float* xt = x.data() + t * x_stride;
      const std::vector<double> xq = q8k_values(xt, c.cols);
      for (int64_t r = 0; r < c.rows; ++r) {
        double want = 0, want_q = 0, mag = 0, bound = 0;
        for (int64_t b = 0; b < c.cols / 256; ++b) {
          double amax = 0, wabs = 0;
          for (int64_t j = b * 256; j < (b + 1) * 256; ++j) {
            const double w = m.dequant[static_cast<size_t>(r * c.cols + j)];
            want += w * xt[j];
            want_q += w * xq[static_cast<size_t>(j)];
            mag += std::fabs(w * xt[j]);
            amax = std::max(amax, std::fabs(static_cast<double>(xt[j])));
            wabs += std::fabs(w);
          }
          bound += wabs * 0.5 * amax / 127.0 * 1.01;
        }
        const float got = ref[static_cast<size_t>(t * y_stride + r)];
        ASSERT_NEAR(got, want_q, 2e-6 * mag + 1e-30) << "reference vs contract, t=" << t << " r=" << r;
        ASSERT_NEAR(got, want, bound + 1e-5 * mag + 1e-30)
            << "reference vs float64 dequantized product, t=" << t << " r=" << r;
      }
      for (int64_t r = c.rows; r < y_stride; ++r) ASSERT_EQ(ref[static_cast<size_t>(t * y_stride + r)], kSentinel);
    }
    for (CpuIsa isa : available_isas()) {
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " threads=" + std::to_string(threads));
        ThreadPool pool(threads);
        std::vector<float> y(ref.size(), kSentinel);
        matmul_with_isa(isa, m.view(), x.data(), c.n_tokens, x_stride, y.data(), y_stride, pool);
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_EQ(std::memcmp(&y[i], &ref[i], sizeof(float)), 0)
              << "differs from the reference at t=" << i / y_stride << " r=" << i % y_stride << ": " << y[i]
              << " vs " << ref[i];
        }
      }
    }
  }
}

// Token counts 1, 3 (row tiles), 17 (a token-lane group and one more), 64 (four groups), 35 with a partial row panel;
// row counts off the 8- and 16-row tiles; 4352 columns = 17 super-blocks.
const std::vector<Case> kKQuantCases = {{1, 256, 1},   {5, 512, 2},   {7, 768, 3},    {37, 256, 5},
                                        {20, 1536, 17}, {9, 512, 33}, {67, 512, 64},  {130, 256, 1},
                                        {19, 4352, 3},  {33, 768, 64}, {18, 1024, 35}};

TEST(CpuMatmul, Q4_KMatchesReference) { check_k_type(DType::kQ4_K, kKQuantCases); }
TEST(CpuMatmul, Q5_KMatchesReference) { check_k_type(DType::kQ5_K, kKQuantCases); }
TEST(CpuMatmul, Q6_KMatchesReference) { check_k_type(DType::kQ6_K, kKQuantCases); }

// Integer sums at their limits: every code, scale and min at its extreme (Q4_K nibbles 15, Q5_K codes 31, scales and
// mins 63; Q6_K codes 63 or 0 with scales 127 or -128) against activations that all quantize to +127 or -127, over 35
// tokens. The AVX2 kernels keep pair sums in 16 bits for several quads; any overflow or saturation shows here.
TEST(CpuMatmul, ExtremeKCodesMatchReference) {
  const int64_t rows = 18, cols = 512, n_tokens = 35;
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(t * cols + c)] = (t % 2 == 0 ? 1.0f : -1.0f) * 0.5f;
  }
  for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int variant = 0; variant < 2; ++variant) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " variant " + std::to_string(variant));
      const int64_t block_bytes = dtype_info(type).type_size;
      const int64_t row_bytes = *dtype_row_bytes(type, cols);
      std::vector<uint8_t> w(static_cast<size_t>(rows * row_bytes));
      const uint16_t one = f32_to_fp16(1.0f), half = f32_to_fp16(0.5f);
      for (int64_t off = 0; off < static_cast<int64_t>(w.size()); off += block_bytes) {
        uint8_t* blk = &w[static_cast<size_t>(off)];
        if (type == DType::kQ6_K) {
          std::memset(blk, variant == 0 ? 0xFF : 0x00, 192);           // ql, qh: codes 63 (value 31) or 0 (-32)
          std::memset(blk + 192, variant == 0 ? 0x7F : 0x80, 16);     // scales 127 or -128
          std::memcpy(blk + 208, &one, 2);
          continue;
        }
        std::memcpy(blk, &one, 2);
        std::memcpy(blk + 2, &half, 2);
        std::memset(blk + 4, variant == 0 ? 0xFF : 0x3F, 12);  // all scales and mins 63 (or the low six bits only)
        std::memset(blk + 16, 0xFF, static_cast<size_t>(block_bytes - 16));
      }
      const MatrixView view{w.data(), type, rows, cols, row_bytes};
      std::vector<float> ref(static_cast<size_t>(n_tokens * rows));
      matmul_reference(view, x.data(), n_tokens, cols, ref.data(), rows);
      for (CpuIsa isa : available_isas()) {
        SCOPED_TRACE(std::string(cpu_isa_name(isa)));
        ThreadPool pool(2);
        std::vector<float> y(ref.size());
        matmul_with_isa(isa, view, x.data(), n_tokens, cols, y.data(), rows, pool);
        ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)), 0) << "differs from the reference";
      }
    }
  }
}

TEST(CpuMatmul, Q8KQuantizersAgreeBitForBit) {
  for (int64_t n : {256, 512, 1536}) {
    std::vector<float> x = random_activations(1, n, n, static_cast<uint32_t>(n) + 1);
    x[7] = -50.0f;  // the block's extreme is negative: d = max / −127 > 0 and it quantizes to −127
    x[300 % n] = 9.0f;
    x[301 % n] = -9.0f;                                               // equal magnitudes: the first one sets the sign
    if (n >= 512) std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
    std::vector<int8_t> q_ref(static_cast<size_t>(n));
    std::vector<float> d_ref(static_cast<size_t>(n / 256));
    std::vector<int16_t> b_ref(static_cast<size_t>(n / 16));
    quantize_activations_q8k(CpuIsa::kReference, x.data(), n, q_ref.data(), d_ref.data(), b_ref.data());
    EXPECT_GT(d_ref[0], 0.0f);
    EXPECT_EQ(q_ref[7], -127);
    for (CpuIsa isa : available_isas()) {
      SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " n=" + std::to_string(n));
      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<float> d(d_ref.size());
      std::vector<int16_t> bs(b_ref.size());
      quantize_activations_q8k(isa, x.data(), n, q.data(), d.data(), bs.data());
      EXPECT_EQ(q, q_ref);
      EXPECT_EQ(std::memcmp(d.data(), d_ref.data(), d.size() * 4), 0);
      EXPECT_EQ(bs, b_ref);
    }
  }
}

TEST(CpuMatmul, ActivationQuantizersAgreeBitForBit) {
  // 576 = 16 blocks + 2 left, 800 = 16 + a partial group of 9, 1536 = 3 x 16.
  for (int64_t n : {32, 64, 96, 576, 800, 1536}) {
    std::vector<float> x = random_activations(1, n, n, static_cast<uint32_t>(n));
    // Values exactly halfway between quantization steps (x·127/amax = k + 0.5) exercise round-half-even.
    for (int64_t j = 0; j < 8 && 32 * 2 + j < n; ++j) x[static_cast<size_t>(64 + j)] = static_cast<float>(j) + 0.5f;
    if (n >= 96) x[64 + 31] = 127.0f;
    // An all-zero block (d = 0, codes 0) and one whose extreme is negative, inside the 16-block vector path.
    if (n >= 576) {
      std::fill(x.begin() + 96, x.begin() + 128, 0.0f);
      x[128 + 5] = -300.0f;
    }
    const int64_t nb = n / 32;
    std::vector<int8_t> q_ref(static_cast<size_t>(n));
    std::vector<float> d_ref(static_cast<size_t>(nb)), s_ref(static_cast<size_t>(nb));
    quantize_activations(CpuIsa::kReference, x.data(), n, q_ref.data(), d_ref.data(), s_ref.data());
    for (CpuIsa isa : available_isas()) {
      SCOPED_TRACE(std::string(cpu_isa_name(isa)) + " n=" + std::to_string(n));
      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<float> d(static_cast<size_t>(nb)), s(static_cast<size_t>(nb));
      quantize_activations(isa, x.data(), n, q.data(), d.data(), s.data());
      EXPECT_EQ(q, q_ref);
      EXPECT_EQ(std::memcmp(d.data(), d_ref.data(), d.size() * 4), 0);
      EXPECT_EQ(std::memcmp(s.data(), s_ref.data(), s.size() * 4), 0);
    }
  }
}

TEST(CpuMatmul, ActivationQuantizationFollowsGgml) {
  // Block 0 is 0, 1, ..., 31 scaled so that amax = 31: id = 127/31 and q = round-half-even(x·id).
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(j) - 15.5f;
  std::vector<int8_t> q(32);
  float d = 0, s = 0;
  quantize_activations(CpuIsa::kReference, x.data(), 32, q.data(), &d, &s);
  const float amax = 15.5f;
  const float id = 127.0f / amax;
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(q[static_cast<size_t>(j)], static_cast<int8_t>(std::nearbyint(x[static_cast<size_t>(j)] * id)));
    sum += q[static_cast<size_t>(j)];
  }
  EXPECT_EQ(d, fp16_to_f32(f32_to_fp16(amax / 127.0f)));
  EXPECT_EQ(s, fp16_to_f32(f32_to_fp16(amax / 127.0f * static_cast<float>(sum))));
}

// A token's output must not depend on the batch it is computed in (its size, its position, the other tokens) nor
// on the thread count: the engine's greedy output has to be the same whether a request runs alone or batched.
// Q8_0 batches of up to two 16-token groups read the weights in place, larger ones decode them first: same bits.
TEST(CpuMatmul, OutputsIndependentOfBatch) {
  const int64_t rows = 37, cols = 512, n_tokens = 56;
  for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kF32, DType::kF16,
                     DType::kBF16, DType::kQ4_K, DType::kQ6_K, DType::kQ5_K}) {
    const bool k_quant = dtype_info(type).block_size == 256;
    const TestMatrix m = k_quant ? make_k_matrix(type, rows, cols, 21) : make_matrix(type, rows, cols, 21);
    const std::vector<float> x = random_activations(n_tokens, cols, cols, 22);
    for (CpuIsa isa : available_isas()) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + std::string(cpu_isa_name(isa)));
      ThreadPool pool2(2), pool1(1);
      std::vector<float> all(static_cast<size_t>(n_tokens * rows));
      matmul_with_isa(isa, m.view(), x.data(), n_tokens, cols, all.data(), rows, pool2);
      // Sub-batches at various offsets and sizes, and every token alone, on one or two threads.
      const int64_t ranges[][2] = {{0, 1}, {5, 26}, {3, 7}, {16, 33}, {0, 17}, {39, 40}, {8, 40}, {16, 48}, {0, 48}};
      for (const auto& range : ranges) {
        for (ThreadPool* pool : {&pool1, &pool2}) {
          const int64_t n = range[1] - range[0];
          std::vector<float> part(static_cast<size_t>(n * rows));
          matmul_with_isa(isa, m.view(), x.data() + range[0] * cols, n, cols, part.data(), rows, *pool);
          ASSERT_EQ(std::memcmp(part.data(), all.data() + range[0] * rows, part.size() * sizeof(float)), 0)
              << "tokens [" << range[0] << ", " << range[1] << ") threads=" << pool->size();
        }
      }
      for (int64_t t = 0; t < n_tokens; ++t) {
        std::vector<float> one(static_cast<size_t>(rows));
        matmul_with_isa(isa, m.view(), x.data() + t * cols, 1, cols, one.data(), rows, pool2);
        ASSERT_EQ(std::memcmp(one.data(), all.data() + t * rows, one.size() * sizeof(float)), 0) << "token " << t;
      }
    }
  }
}

// A matmul called from inside a task of its own pool runs inline on that thread: every output computed, the same bits
// as a top-level call. Shapes cover both ways activations are prepared (each thread its own copy / one shared copy).
TEST(CpuMatmul, NestedCallMatchesTopLevel) {
  const TestMatrix m = make_matrix(DType::kQ4_1, 200, 1536, 31);
  for (int64_t n_tokens : {2, 40}) {
    const std::vector<float> x = random_activations(n_tokens, 1536, 1536, 32);
    ThreadPool pool(2);
    std::vector<float> top(static_cast<size_t>(n_tokens * 200)), nested(top.size(), -12345.0f);
    matmul(m.view(), x.data(), n_tokens, 1536, top.data(), 200, pool);
    pool.run([&](int index, int) {
      if (index == 0) matmul(m.view(), x.data(), n_tokens, 1536, nested.data(), 200, pool);
    });
    EXPECT_EQ(std::memcmp(top.data(), nested.data(), top.size() * sizeof(float)), 0) << n_tokens << " tokens";
  }
}

TEST(CpuMatmul, DefaultDispatchMatchesSelectedIsa) {
  const TestMatrix m = make_matrix(DType::kQ4_1, 20, 576, 77);
  const std::vector<float> x = random_activations(3, 576, 576, 78);
  ThreadPool pool(2);
  std::vector<float> a(3 * 20), b(3 * 20);
  matmul(m.view(), x.data(), 3, 576, a.data(), 20, pool);
  matmul_with_isa(cpu_selected_isa(), m.view(), x.data(), 3, 576, b.data(), 20, pool);
  EXPECT_EQ(a, b);
}

TEST(CpuMatmul, MultiMatchesSeparateCalls) {
  for (DType type : {DType::kQ4_1, DType::kQ8_0, DType::kF32}) {
    const TestMatrix q = make_matrix(type, 64, 576, 11), k = make_matrix(type, 21, 576, 12),
                     v = make_matrix(type, 8, 576, 13);
    for (int64_t n_tokens : {1, 3, 40}) {
      const std::vector<float> x = random_activations(n_tokens, 576, 576, 14);
      ThreadPool pool(2);
      std::vector<float> yq(static_cast<size_t>(n_tokens * 64)), yk(static_cast<size_t>(n_tokens * 21)),
          yv(static_cast<size_t>(n_tokens * 8));
      const MatmulTarget targets[] = {{q.view(), yq.data(), 64}, {k.view(), yk.data(), 21}, {v.view(), yv.data(), 8}};
      matmul_multi(targets, 3, x.data(), n_tokens, 576, pool);
      for (const MatmulTarget& t : targets) {
        std::vector<float> want(static_cast<size_t>(n_tokens * t.w.rows));
        matmul(t.w, x.data(), n_tokens, 576, want.data(), t.w.rows, pool);
        EXPECT_EQ(std::memcmp(want.data(), t.y, want.size() * sizeof(float)), 0) << dtype_name(type) << " " << n_tokens;
      }
    }
  }
  // A Q4_K_M / Q5_K_M layer's projections mix the k-quants, which share the Q8_K activations.
  {
    const TestMatrix q = make_k_matrix(DType::kQ4_K, 40, 512, 11), k = make_k_matrix(DType::kQ5_K, 21, 512, 12),
                     v = make_k_matrix(DType::kQ6_K, 8, 512, 13);
    ASSERT_TRUE(matmul_shares_activations(DType::kQ4_K, DType::kQ6_K));
    ASSERT_TRUE(matmul_shares_activations(DType::kQ5_K, DType::kQ6_K));
    for (int64_t n_tokens : {1, 3, 40}) {
      const std::vector<float> x = random_activations(n_tokens, 512, 512, 14);
      ThreadPool pool(2);
      std::vector<float> yq(static_cast<size_t>(n_tokens * 40)), yk(static_cast<size_t>(n_tokens * 21)),
          yv(static_cast<size_t>(n_tokens * 8));
      const MatmulTarget targets[] = {{q.view(), yq.data(), 40}, {k.view(), yk.data(), 21}, {v.view(), yv.data(), 8}};
      matmul_multi(targets, 3, x.data(), n_tokens, 512, pool);
      for (const MatmulTarget& t : targets) {
        std::vector<float> want(static_cast<size_t>(n_tokens * t.w.rows));
        matmul(t.w, x.data(), n_tokens, 512, want.data(), t.w.rows, pool);
        EXPECT_EQ(std::memcmp(want.data(), t.y, want.size() * sizeof(float)), 0)
            << dtype_name(t.w.type) << " " << n_tokens;
      }
    }
  }
  const TestMatrix a = make_matrix(DType::kQ4_1, 4, 64, 1), b = make_matrix(DType::kQ4_1, 4, 96, 2);
  const TestMatrix c = make_matrix(DType::kQ8_0, 4, 64, 3);
  std::vector<float> x(96), y1(4), y2(4);
  ThreadPool pool(1);
  const MatmulTarget cols_differ[] = {{a.view(), y1.data(), 4}, {b.view(), y2.data(), 4}};
  EXPECT_THROW(matmul_multi(cols_differ, 2, x.data(), 1, 96, pool), Error);
  const MatmulTarget schemes_differ[] = {{a.view(), y1.data(), 4}, {c.view(), y2.data(), 4}};
  EXPECT_THROW(matmul_multi(schemes_differ, 2, x.data(), 1, 96, pool), Error);
}

// Any deterministic elementwise function serves: matmul_swiglu must give what writing its rows and then calling
// matmul gives.
void test_silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < ffn; ++i) {
      const float g = gate[t * in_stride + i];
      out[t * ffn + i] = g / (1.0f + std::exp(-g)) * up[t * in_stride + i];
    }
  }
}

TEST(CpuMatmul, SwigluMatchesSiluMulThenMatmul) {
  constexpr int64_t kCols = 768, kRows = 40;
  for (DType type : {DType::kQ4_1, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kF16, DType::kBF16, DType::kF32}) {
    const TestMatrix m = type == DType::kQ4_K ? make_k_matrix(type, kRows, kCols, 21) : make_matrix(type, kRows, kCols, 21);
    // 1 token (row lanes), 16 and 37 (token lanes; each thread prepares its own copy), 130 (one shared copy).
    for (int64_t n_tokens : {1, 16, 37, 130}) {
      // Gate and up stacked in one row, as the fused gate/up projection writes them.
      const std::vector<float> gate_up = random_activations(n_tokens, 2 * kCols, 2 * kCols, 22);
      std::vector<float> rows(static_cast<size_t>(n_tokens * kCols));
      test_silu_mul(gate_up.data(), gate_up.data() + kCols, 2 * kCols, n_tokens, kCols, rows.data());
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> want(static_cast<size_t>(n_tokens * kRows)), got(want.size());
        matmul(m.view(), rows.data(), n_tokens, kCols, want.data(), kRows, pool);
        std::vector<float> written(rows.size(), -1.0f);
        matmul_swiglu(m.view(), {gate_up.data(), gate_up.data() + kCols, 2 * kCols, &test_silu_mul}, n_tokens,
                      written.data(), got.data(), kRows, pool);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
            << dtype_name(type) << " tokens " << n_tokens << " threads " << threads;
        if (type == DType::kF32) {
          EXPECT_EQ(written, rows);  // its kernels read the rows themselves
        }
      }
    }
  }
}

// A background walk changes no result, and the token-lane tiles (AVX-512) advance every thread's walk.
TEST(CpuMatmul, BackgroundPrefetchChangesNoResult) {
  const std::vector<char> other(1 << 20);
  constexpr int64_t kCols = 768;
  for (DType type : {DType::kQ4_1, DType::kQ8_0, DType::kF16, DType::kQ4_K}) {
    const TestMatrix m = type == DType::kQ4_K ? make_k_matrix(type, 96, kCols, 31) : make_matrix(type, 96, kCols, 31);
    for (int64_t n_tokens : {1, 32, 70}) {
      const std::vector<float> x = random_activations(n_tokens, kCols, kCols, 32);
      ThreadPool pool(2);
      std::vector<float> want(static_cast<size_t>(n_tokens * 96)), got(want.size());
      matmul(m.view(), x.data(), n_tokens, kCols, want.data(), 96, pool);
      BackgroundPrefetch prefetch;
      prefetch.publish({{other.data(), 1 << 19}, {other.data() + (1 << 19), 1 << 19}}, 2);
      matmul(m.view(), x.data(), n_tokens, kCols, got.data(), 96, pool, &prefetch);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
          << dtype_name(type) << " tokens " << n_tokens;
      if (cpu_selected_isa() == CpuIsa::kAvx512 && type != DType::kF16 && n_tokens >= 16) {
        for (int t = 0; t < 2; ++t) {
          EXPECT_GT(prefetch.cursor(t)->offset, 0) << "thread " << t << " did not walk, " << dtype_name(type);
        }
      }
    }
  }
}

TEST(CpuMatmul, SupportsAndRejects) {
  for (DType t :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0}) {
    EXPECT_TRUE(matmul_supports(t)) << dtype_name(t);
  }
  EXPECT_FALSE(matmul_supports(DType::kI32));
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) EXPECT_TRUE(matmul_supports(t)) << dtype_name(t);
  // Everything else core/quant.h can dequantize goes through the slow fallback.
  for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kFP8_E4M3}) {
    EXPECT_EQ(matmul_supports(t), can_dequantize(t)) << dtype_name(t);
  }
  ThreadPool pool(1);
  std::vector<uint8_t> w(1024);
  std::vector<float> x(64), y(64);
  EXPECT_THROW(matmul({w.data(), DType::kI32, 2, 32, 128}, x.data(), 1, 32, y.data(), 2, pool), Error);
  EXPECT_THROW(matmul({w.data(), DType::kQ4_1, 2, 33, 40}, x.data(), 1, 33, y.data(), 2, pool), Error);
  EXPECT_THROW(matmul({w.data(), DType::kQ4_1, 2, 32, 19}, x.data(), 1, 32, y.data(), 2, pool), Error);
  EXPECT_THROW(matmul({w.data(), DType::kF32, 2, 32, 128}, x.data(), 2, 16, y.data(), 2, pool), Error);
  EXPECT_THROW(matmul({w.data(), DType::kF32, 4, 8, 32}, x.data(), 2, 8, y.data(), 3, pool), Error);
  // Empty work is fine.
  EXPECT_NO_THROW(matmul({w.data(), DType::kF32, 0, 8, 32}, x.data(), 2, 8, y.data(), 0, pool));
  EXPECT_NO_THROW(matmul({w.data(), DType::kF32, 2, 8, 32}, x.data(), 0, 8, y.data(), 2, pool));
}

TEST(CpuMatmul, IsaNames) {
  EXPECT_EQ(cpu_isa_from_name("avx512"), CpuIsa::kAvx512);
  EXPECT_EQ(cpu_isa_from_name("avx2"), CpuIsa::kAvx2);
  EXPECT_EQ(cpu_isa_from_name("reference"), CpuIsa::kReference);
  EXPECT_FALSE(cpu_isa_from_name("sse9").has_value());
  EXPECT_TRUE(cpu_supports(CpuIsa::kReference));
  EXPECT_TRUE(cpu_supports(cpu_best_isa()));
  if (cpu_supports(CpuIsa::kAvx512)) {
    EXPECT_TRUE(cpu_supports(CpuIsa::kAvx2));
  }
}

}  // namespace
}  // namespace servetune::cpu
