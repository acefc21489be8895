// CPU ops other than matmul against their plain C++ reference: the SIMD attention kernels on random paged caches of
// awkward sizes (head dims, context lengths, GQA ratios, page sizes, scattered block tables), rope invariants, and
// the fused ops of compile = fused giving the same bits as the unfused sequence; make_resident.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend/cpu/activation_simd.h"
#include "backend/cpu/attention_simd.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kv_layout.h"
#include "backend/cpu/lane_sums.h"
#include "backend/cpu/ops_reference.h"
#include "backend/cpu/rope_simd.h"
#include "backend/cpu/vector_math.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"

namespace servetune::cpu {
namespace {

// Every head is checked eight ways: alone, within its whole GQA group, within a partial group starting at it, within
// all the token's heads, within a range that starts inside one group and ends inside another, and with the other
// tokens of its sequence (a run: all heads, by group, a run of two); all must give the same bits (a head's result
// may not depend on the grouping the scheduler picked).
void check_attention(detail::AttentionGroupKernel kernel, int64_t width, DType kv_dtype) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t hd : {8, 16, 24, 32, 64, 128}) {
    if (!detail::attention_simd_supports(hd, width)) continue;
    for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}, {9, 3}}) {
      for (int64_t page : {1, 5, 16}) {
        const int64_t n_ctx = 1 + static_cast<int64_t>(rng() % 300);
        const int64_t blocks = (n_ctx + page - 1) / page;
        const int64_t num_blocks = blocks + 3;
        std::vector<float> k(static_cast<size_t>(num_blocks * page * n_kv * hd)), v(k.size());
        for (auto& x : k) x = normal(rng);
        for (auto& x : v) x = normal(rng);
        std::vector<uint16_t> k16(k.size()), v16(v.size()), kb16(k.size()), vb16(v.size());
        for (size_t i = 0; i < k.size(); ++i) k16[i] = f32_to_fp16(k[i]), v16[i] = f32_to_fp16(v[i]);
        for (size_t i = 0; i < k.size(); ++i) kb16[i] = f32_to_bf16(k[i]), vb16[i] = f32_to_bf16(v[i]);
        std::vector<uint8_t> k8(k.size()), v8(v.size());
        for (size_t i = 0; i < k.size(); ++i) k8[i] = f32_to_fp8_e4m3(k[i]), v8[i] = f32_to_fp8_e4m3(v[i]);
        void* k_data = kv_dtype == DType::kF16        ? static_cast<void*>(k16.data())
                       : kv_dtype == DType::kBF16     ? static_cast<void*>(kb16.data())
                       : kv_dtype == DType::kFP8_E4M3 ? static_cast<void*>(k8.data())
                                                      : k.data();
        void* v_data = kv_dtype == DType::kF16        ? static_cast<void*>(v16.data())
                       : kv_dtype == DType::kBF16     ? static_cast<void*>(vb16.data())
                       : kv_dtype == DType::kFP8_E4M3 ? static_cast<void*>(v8.data())
                                                      : v.data();
        std::vector<int32_t> table(static_cast<size_t>(blocks));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng);  // blocks scattered in the cache
        KvLayerView kv{k_data, v_data, kv_dtype, num_blocks, page, n_kv, hd};
        // Three tokens of one sequence: the last position, one in the middle, and the first.
        std::vector<int32_t> positions = {static_cast<int32_t>(n_ctx - 1), static_cast<int32_t>((n_ctx - 1) / 2), 0};
        std::vector<int32_t> seq = {0, 0, 0};
        AttentionBatch batch{3, positions.data(), seq.data(), table.data(), blocks};
        std::vector<float> q(static_cast<size_t>(3 * n_heads * hd));
        for (auto& x : q) x = normal(rng);
        const int64_t group = n_heads / n_kv;
        std::vector<float> ref_scratch(static_cast<size_t>(n_ctx)), want(static_cast<size_t>(hd));
        std::vector<float> scratch(static_cast<size_t>(detail::attention_scratch_floats(n_heads, n_ctx)));
        std::vector<float> alone(q.size()), grouped(q.size()), partial(q.size()), whole(q.size()), across(q.size());
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        // The three tokens as one run (each K/V row read once for all of them), whole and by KV head; the last two
        // as a run of their own.
        std::vector<float> run_scratch(static_cast<size_t>(detail::attention_scratch_floats(3 * n_heads, n_ctx)));
        std::vector<float> run_whole(q.size()), run_grouped(q.size()), run_pair(q.size());
        kernel(kv, batch, q.data(), n_heads, scale, 0, 3, 0, n_heads, run_scratch.data(), run_whole.data());
        for (int64_t h = 0; h < n_heads; h += group) {
          kernel(kv, batch, q.data(), n_heads, scale, 0, 3, h, group, run_scratch.data(), run_grouped.data());
        }
        kernel(kv, batch, q.data(), n_heads, scale, 0, 1, 0, n_heads, run_scratch.data(), run_pair.data());
        kernel(kv, batch, q.data(), n_heads, scale, 1, 3, 0, n_heads, run_scratch.data(), run_pair.data());
        for (int64_t t = 0; t < 3; ++t) {
          for (int64_t h = 0; h < n_heads; ++h) {
            kernel(kv, batch, q.data(), n_heads, scale, t, t + 1, h, 1, scratch.data(), alone.data());
          }
          for (int64_t h = 0; h < n_heads; h += group) {
            kernel(kv, batch, q.data(), n_heads, scale, t, t + 1, h, group, scratch.data(), grouped.data());
            kernel(kv, batch, q.data(), n_heads, scale, t, t + 1, h, 1, scratch.data(), partial.data());
            if (group > 1) kernel(kv, batch, q.data(), n_heads, scale, t, t + 1, h + 1, group - 1, scratch.data(), partial.data());
          }
          kernel(kv, batch, q.data(), n_heads, scale, t, t + 1, 0, n_heads, scratch.data(), whole.data());
          kernel(kv, batch, q.data(), n_heads, scale, t, t + 1, 0, 1, scratch.data(), across.data());
          kernel(kv, batch, q.data(), n_heads, scale, t, t + 1, 1, n_heads - 2, scratch.data(), across.data());
          kernel(kv, batch, q.data(), n_heads, scale, t, t + 1, n_heads - 1, 1, scratch.data(), across.data());
          for (int64_t h = 0; h < n_heads; ++h) {
            ref::attention_head(kv, batch, q.data(), n_heads, scale, t, h, ref_scratch.data(), want.data());
            for (int64_t d = 0; d < hd; ++d) {
              const auto i = static_cast<size_t>((t * n_heads + h) * hd + d);
              ASSERT_NEAR(alone[i], want[static_cast<size_t>(d)], 1e-5f)
                  << "hd " << hd << " heads " << n_heads << "/" << n_kv << " page " << page << " ctx " << n_ctx
                  << " token " << t << " head " << h;
              ASSERT_EQ(grouped[i], alone[i]) << "head " << h << " differs when computed with its group";
              ASSERT_EQ(partial[i], alone[i]) << "head " << h << " differs when computed in a partial group";
              ASSERT_EQ(whole[i], alone[i]) << "head " << h << " differs when computed with all the token's heads";
              ASSERT_EQ(across[i], alone[i]) << "head " << h << " differs when computed in a range across groups";
              ASSERT_EQ(run_whole[i], alone[i]) << "token " << t << " head " << h << " differs in a run of tokens";
              ASSERT_EQ(run_grouped[i], alone[i]) << "token " << t << " head " << h << " differs in a run by KV head";
              ASSERT_EQ(run_pair[i], alone[i]) << "token " << t << " head " << h << " differs in a run of two";
            }
          }
        }
      }
    }
  }
}

TEST(CpuOps, AttentionAvx512MatchesReference) {
  if (!cpu_supports(CpuIsa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  check_attention(&detail::attention_group_avx512, 16, DType::kF32);
  check_attention(&detail::attention_group_avx512, 16, DType::kF16);
  check_attention(&detail::attention_group_avx512, 16, DType::kBF16);
  check_attention(&detail::attention_group_avx512, 16, DType::kFP8_E4M3);
}

TEST(CpuOps, AttentionAvx2MatchesReference) {
  if (!cpu_supports(CpuIsa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  check_attention(&detail::attention_group_avx2, 8, DType::kF32);
  check_attention(&detail::attention_group_avx2, 8, DType::kF16);
  check_attention(&detail::attention_group_avx2, 8, DType::kBF16);
  check_attention(&detail::attention_group_avx2, 8, DType::kFP8_E4M3);
}

using SiluMulKernel = void (*)(const float*, const float*, int64_t, int64_t, int64_t, float*);

// Gates span the range where exp over- and underflows; rows are strided and widths not multiples of the vector.
void check_silu_mul(SiluMulKernel kernel) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> gate_value(-120.0f, 120.0f);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t ffn : {1, 7, 16, 37, 1536}) {
    const int64_t n = 3, stride = ffn * 2 + 5;
    std::vector<float> gate(static_cast<size_t>(n * stride)), up(gate.size());
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = (i % 3 == 0) ? gate_value(rng) : normal(rng);
    for (auto& x : up) x = normal(rng);
    std::vector<float> want(static_cast<size_t>(n * ffn)), got(want.size());
    ref::silu_mul(gate.data(), up.data(), stride, n, ffn, want.data());
    kernel(gate.data(), up.data(), stride, n, ffn, got.data());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::fabs(want[i]))) << "ffn " << ffn << " at " << i;
    }
  }
}

TEST(CpuOps, SiluMulAvx512MatchesReference) {
  if (!cpu_supports(CpuIsa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  check_silu_mul(&detail::silu_mul_f32_avx512);
}

TEST(CpuOps, SiluMulAvx2MatchesReference) {
  if (!cpu_supports(CpuIsa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  check_silu_mul(&detail::silu_mul_f32_avx2);
}

using RmsNormKernel = void (*)(const float*, const float*, float*, int64_t, int64_t, float);
using AddRmsNormKernel = void (*)(float*, const float*, const float*, float*, int64_t, int64_t, float);

// The SIMD norms keep the reference's double lanes and their order: the same bits, in place too, on widths off the
// vector and lane counts, with a row of large values whose squares need the double sum.
void check_rms_norm(RmsNormKernel norm, AddRmsNormKernel add_norm) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t dim : {1, 5, 8, 17, 576, 1003}) {
    const int64_t n = 4;
    std::vector<float> x(static_cast<size_t>(n * dim)), residual(x.size()), w(static_cast<size_t>(dim));
    for (auto& v : x) v = normal(rng);
    for (auto& v : residual) v = normal(rng);
    for (auto& v : w) v = normal(rng);
    for (int64_t i = 0; i < dim; ++i) x[static_cast<size_t>(2 * dim + i)] *= 1e18f;
    std::vector<float> want(x.size()), got(x.size());
    ref::rms_norm(x.data(), w.data(), want.data(), n, dim, 1e-5f);
    norm(x.data(), w.data(), got.data(), n, dim, 1e-5f);
    EXPECT_EQ(got, want) << "rms_norm, dim " << dim;
    std::vector<float> in_place = x;
    norm(in_place.data(), w.data(), in_place.data(), n, dim, 1e-5f);
    EXPECT_EQ(in_place, want) << "rms_norm in place, dim " << dim;
    std::vector<float> x_want = x, x_got = x, y_want(x.size()), y_got = residual;  // y_got aliases the residual
    ref::add_rms_norm(x_want.data(), residual.data(), w.data(), y_want.data(), n, dim, 1e-5f);
    add_norm(x_got.data(), y_got.data(), w.data(), y_got.data(), n, dim, 1e-5f);
    EXPECT_EQ(x_got, x_want) << "add_rms_norm sum, dim " << dim;
    EXPECT_EQ(y_got, y_want) << "add_rms_norm, dim " << dim;
  }
}

TEST(CpuOps, RmsNormAvx512MatchesReferenceBitForBit) {
  if (!cpu_supports(CpuIsa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  check_rms_norm(&detail::rms_norm_avx512, &detail::add_rms_norm_avx512);
}

TEST(CpuOps, RmsNormAvx2MatchesReferenceBitForBit) {
  if (!cpu_supports(CpuIsa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  check_rms_norm(&detail::rms_norm_avx2, &detail::add_rms_norm_avx2);
}

// max_value and exp_scaled (the sampler's softmax) against std on lengths around the vector widths, with the
// maximum in the vector part and in the scalar tail.
TEST(CpuOps, VectorMathMatchesStd) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  for (size_t n : {1u, 7u, 8u, 15u, 16u, 17u, 33u, 49152u}) {
    for (size_t peak : {size_t{0}, n - 1}) {
      std::vector<float> x(n);
      for (auto& v : x) v = normal(rng);
      x[peak] = 100.0f;
      ASSERT_EQ(cpu::max_value(x), 100.0f) << n;
      std::vector<float> out(n);
      const double sum = cpu::exp_scaled(x, 100.0f, 0.5f, out);
      double want_sum = 0.0;
      for (size_t i = 0; i < n; ++i) {
        const float want = std::exp((x[i] - 100.0f) * 0.5f);
        ASSERT_NEAR(out[i], want, 2e-6f * want + 1e-37f) << "n " << n << " at " << i;
        want_sum += want;
      }
      EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << n;
    }
  }
}

// The sampler's kernels on every ISA this CPU has, at lengths around the vector widths and the sum blocks:
// exp_scaled_blocks writes that ISA's exp_scaled weights and, bit for bit, lane_block_sum of each block of them;
// argmax_first is std::max_element's index (first of tied maxima, signed zeros, NaN anywhere in the row).
TEST(CpuOps, SamplerKernelsMatchTheirDefinitions) {
  using BlocksKernel = void (*)(const float*, int64_t, float, float, float*, double*);
  using ExpKernel = double (*)(const float*, int64_t, float, float, float*);
  using ArgmaxKernel = int64_t (*)(const float*, int64_t);
  std::vector<std::tuple<std::string, BlocksKernel, ExpKernel, ArgmaxKernel>> kernels;
  if (cpu_supports(CpuIsa::kAvx512)) {
    kernels.emplace_back("avx512", &detail::exp_scaled_blocks_avx512, &detail::exp_scaled_avx512,
                         &detail::argmax_first_avx512);
  }
  if (cpu_supports(CpuIsa::kAvx2)) {
    kernels.emplace_back("avx2", &detail::exp_scaled_blocks_avx2, &detail::exp_scaled_avx2, &detail::argmax_first_avx2);
  }
  if (kernels.empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (const auto& [name, blocks, exp_scaled, argmax] : kernels) {
    for (int64_t n : {1, 7, 15, 16, 17, 255, 256, 257, 4099, 49152}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = normal(rng);
      const float shift = cpu::max_value(x);
      std::vector<float> want(x.size()), got(x.size());
      exp_scaled(x.data(), n, shift, 0.7f, want.data());
      std::vector<double> sums(static_cast<size_t>((n + cpu::kSumBlock - 1) / cpu::kSumBlock));
      blocks(x.data(), n, shift, 0.7f, got.data(), sums.data());
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], want[i]) << name << " n " << n << " at " << i;
      for (size_t b = 0; b < sums.size(); ++b) {
        const int64_t b0 = static_cast<int64_t>(b) * cpu::kSumBlock;
        ASSERT_EQ(sums[b], cpu::lane_block_sum(got.data() + b0, std::min(cpu::kSumBlock, n - b0)))
            << name << " n " << n << " block " << b;
      }
      // Rounded logits tie often; the maximum also sits in the tail, at 0, or as +-0 ties.
      for (int variant = 0; variant < 5; ++variant) {
        std::vector<float> row = x;
        if (variant == 1) {
          for (auto& v : row) v = std::round(v / 4.0f);
        } else if (variant == 2) {
          row.back() = 1e9f;
        } else if (variant == 3) {
          for (auto& v : row) v = -std::fabs(v) - 1.0f;
          row[row.size() / 2] = -0.0f;
          row.back() = 0.0f;
        } else if (variant == 4) {
          row[row.size() / 3] = NAN;
        }
        const auto expected = std::max_element(row.begin(), row.end()) - row.begin();
        ASSERT_EQ(argmax(row.data(), n), expected) << name << " n " << n << " variant " << variant;
      }
    }
  }
}

// to_f16 (the f16 KV cache's stores) equals the scalar conversion on normal, subnormal, overflowing and
// tie-breaking values, at lengths around the vector widths.
TEST(CpuOps, ToF16MatchesScalarConversion) {
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> specials = {0.0f, -0.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6e-8f, 3e-8f, 1e-5f, -2e-6f,
                                 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, INFINITY, -INFINITY};
  for (size_t n : {1u, 15u, 16u, 17u, 40u, 1000u}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = i % 3 == 0 ? specials[i / 3 % specials.size()] : normal(rng);
    std::vector<uint16_t> got(n);
    cpu::to_f16(x, got.data());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], f32_to_fp16(x[i])) << "n " << n << " value " << x[i];
  }
  uint16_t nan_half = 0;
  const float nan = NAN;
  cpu::to_f16({&nan, 1}, &nan_half);
  EXPECT_TRUE(std::isnan(fp16_to_f32(nan_half)));
}

// Each ISA's rotary embedding gives ref::rope_heads' bits: interleaved pairs and NeoX halves, whole and partial
// rotary dims, dims the vectors do not divide (the reference path), positions up to 2^16, llama3 frequency factors.
TEST(CpuOps, RopeHeadsMatchReferenceBits) {
  using Rope = void (*)(float*, int64_t, const float*, const RopeParams&);
  std::vector<std::pair<std::string, Rope>> kernels;
  if (cpu_supports(CpuIsa::kAvx512)) kernels.emplace_back("avx512", &detail::rope_heads_avx512);
  if (cpu_supports(CpuIsa::kAvx2)) kernels.emplace_back("avx2", &detail::rope_heads_avx2);
  if (kernels.empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> factors(64);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + static_cast<float>(i % 5);
  struct Case {
    int64_t head_dim, rope_dim;
    bool neox, freq_factors;
  };
  for (const Case c : {Case{64, 64, false, false}, Case{64, 64, true, false}, Case{128, 128, true, true},
                       Case{128, 64, false, true}, Case{128, 32, true, false}, Case{48, 48, false, false},
                       Case{40, 40, true, false}, Case{8, 8, false, false}}) {
    RopeParams p;
    p.head_dim = c.head_dim;
    p.rope_dim = c.rope_dim;
    p.neox = c.neox;
    p.theta = 500000.0f;
    p.freq_factors = c.freq_factors ? factors.data() : nullptr;
    for (const float position : {0.0f, 1.0f, 37.0f, 4095.0f, 65535.0f}) {
      std::vector<float> cos_sin(static_cast<size_t>(c.rope_dim));
      ref::rope_cache(position, p, cos_sin.data());
      const int64_t n_heads = 3;
      std::vector<float> x(static_cast<size_t>(n_heads * c.head_dim));
      for (float& v : x) v = normal(rng);
      std::vector<float> want = x;
      ref::rope_heads(want.data(), n_heads, cos_sin.data(), p);
      for (const auto& [name, rope] : kernels) {
        std::vector<float> got = x;
        rope(got.data(), n_heads, cos_sin.data(), p);
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
              << name << " head_dim " << c.head_dim << " rope_dim " << c.rope_dim << " neox " << c.neox << " position "
              << position << " element " << i;
        }
      }
    }
  }
}

// to_fp8_e4m3 (the FP8 KV cache's stores), through each ISA's kernel, equals the scalar conversion on normal,
// subnormal, saturating, tie-breaking and NaN values, at lengths around the vector widths; and the vector loads the
// attention kernels widen FP8 rows with give fp8_e4m3_to_f32 of every code.
TEST(CpuOps, ToFp8MatchesScalarConversion) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 30.0f);
  const std::vector<float> specials = {0.0f,     -0.0f,      448.0f,   449.0f,    464.0f,    465.0f,  -1e6f,
                                       INFINITY, -INFINITY,  NAN,      0x1p-6f,   0x1p-9f,   0x1.8p-10f, 0x1p-10f,
                                       0x0.9p-6f, 0x1.7p-6f, 1.0625f,  1.1875f,   -3e-3f,    0x1.fp-7f, 1e-30f};
  using Convert = void (*)(const float*, int64_t, uint8_t*);
  std::vector<std::pair<std::string, Convert>> converters = {
      {"dispatch", [](const float* x, int64_t n, uint8_t* out) { cpu::to_fp8_e4m3({x, static_cast<size_t>(n)}, out); }}};
  if (cpu_supports(CpuIsa::kAvx512)) converters.emplace_back("avx512", &detail::to_fp8_e4m3_avx512);
  if (cpu_supports(CpuIsa::kAvx2)) converters.emplace_back("avx2", &detail::to_fp8_e4m3_avx2);
  for (const auto& [name, convert] : converters) {
    for (size_t n : {1u, 7u, 8u, 9u, 16u, 17u, 40u, 1000u}) {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = i % 2 == 0 ? specials[i / 2 % specials.size()] : normal(rng);
      std::vector<uint8_t> got(n);
      convert(x.data(), static_cast<int64_t>(n), got.data());
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], f32_to_fp8_e4m3(x[i])) << name << " n " << n << " value " << x[i];
    }
  }
  std::vector<uint8_t> codes(256);
  std::iota(codes.begin(), codes.end(), 0);
  std::vector<float> want(256), got(256);
  for (int c = 0; c < 256; ++c) want[static_cast<size_t>(c)] = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
  using Widen = void (*)(const uint8_t*, int64_t, float*);
  std::vector<std::pair<std::string, Widen>> wideners;
  if (cpu_supports(CpuIsa::kAvx512)) wideners.emplace_back("avx512", &detail::widen_fp8_e4m3_avx512);
  if (cpu_supports(CpuIsa::kAvx2)) wideners.emplace_back("avx2", &detail::widen_fp8_e4m3_avx2);
  for (const auto& [name, widen] : wideners) {
    widen(codes.data(), 256, got.data());
    for (size_t c = 0; c < 256; ++c) {
      if (std::isnan(want[c])) {
        EXPECT_TRUE(std::isnan(got[c])) << name << " code " << c;
      } else {
        EXPECT_EQ(f32_to_bits(got[c]), f32_to_bits(want[c])) << name << " code " << c;
      }
    }
  }
}

TEST(CpuOps, RopeIsARotation) {
  // Rotation keeps each pair's norm, and position 0 is the identity, in both pair layouts.
  for (bool neox : {false, true}) {
    RopeParams p;
    p.head_dim = 64;
    p.rope_dim = 48;
    p.theta = 10000.0f;
    p.neox = neox;
    std::vector<float> x(64), y;
    std::iota(x.begin(), x.end(), 1.0f);
    y = x;
    int32_t pos0 = 0;
    ref::rope(y.data(), &pos0, 1, 1, p);
    EXPECT_EQ(x, y);
    int32_t pos = 1234;
    ref::rope(y.data(), &pos, 1, 1, p);
    double before = 0, after = 0;
    for (size_t i = 0; i < 64; ++i) before += x[i] * x[i], after += y[i] * y[i];
    EXPECT_NEAR(before, after, 1e-3 * before);
    for (size_t i = 48; i < 64; ++i) EXPECT_EQ(x[i], y[i]);  // dims past rope_dim are untouched
  }
}

std::vector<float> normal_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

TEST(CpuOps, FusedAddRmsNormEqualsAddThenNorm) {
  CpuBackend backend(2);
  const int64_t n = 7, dim = 301;
  const auto x0 = normal_values(static_cast<size_t>(n * dim), 1), residual = normal_values(x0.size(), 2);
  const auto w = normal_values(static_cast<size_t>(dim), 3);
  std::vector<float> x_ref = x0, y_ref(x0.size());
  backend.add(x_ref.data(), residual.data(), n * dim);
  backend.rms_norm(x_ref.data(), w.data(), y_ref.data(), n, dim, 1e-6f);
  std::vector<float> x = x0, y = residual;  // y aliases the residual, as the fused layer path uses it
  backend.add_rms_norm(x.data(), y.data(), w.data(), y.data(), n, dim, 1e-6f);
  EXPECT_EQ(x, x_ref);
  EXPECT_EQ(y, y_ref);
}

TEST(CpuOps, FusedRopeStoreQkvEqualsRopeThenStore) {
  CpuBackend backend(2);
  // Positions inside the backend's rotary table, and a batch reaching past it (the per-token fallback).
  for (int32_t far : {9, 70000}) {
    for (DType kv_dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8_E4M3}) {
      for (bool neox : {false, true}) {
        const int64_t n = 5, n_heads = 6, n_kv = 2, hd = 24, page = 4, num_blocks = 4;
        RopeParams p;
        p.head_dim = hd;
        p.rope_dim = 16;
        p.neox = neox;
        const int64_t qw = n_heads * hd, kvw = n_kv * hd, row = qw + 2 * kvw;
        const auto qkv = normal_values(static_cast<size_t>(n * row), 4);
        const std::vector<int32_t> positions = {3, 4, 5, 0, far}, slots = {7, 8, 9, 0, 13};
        std::vector<float> q(static_cast<size_t>(n * qw)), k(static_cast<size_t>(n * kvw)), v(k.size());
        for (int64_t t = 0; t < n; ++t) {
          std::copy_n(qkv.begin() + t * row, qw, q.begin() + t * qw);
          std::copy_n(qkv.begin() + t * row + qw, kvw, k.begin() + t * kvw);
          std::copy_n(qkv.begin() + t * row + qw + kvw, kvw, v.begin() + t * kvw);
        }
        const size_t cache_bytes = static_cast<size_t>(num_blocks * page * kvw) * static_cast<size_t>(dtype_info(kv_dtype).type_size);
        auto k_ref = backend.allocate(cache_bytes), v_ref = backend.allocate(cache_bytes);
        auto k_fused = backend.allocate(cache_bytes), v_fused = backend.allocate(cache_bytes);
        std::memset(k_ref->data(), 0, cache_bytes), std::memset(v_ref->data(), 0, cache_bytes);
        std::memset(k_fused->data(), 0, cache_bytes), std::memset(v_fused->data(), 0, cache_bytes);
        const KvLayerView ref_kv{k_ref->data(), v_ref->data(), kv_dtype, num_blocks, page, n_kv, hd};
        const KvLayerView fused_kv{k_fused->data(), v_fused->data(), kv_dtype, num_blocks, page, n_kv, hd};
        backend.rope(q.data(), positions.data(), n, n_heads, p);
        backend.rope(k.data(), positions.data(), n, n_kv, p);
        backend.store_kv(ref_kv, k.data(), v.data(), slots.data(), n);
        std::vector<float> q_fused(q.size());
        backend.rope_store_qkv(fused_kv, qkv.data(), positions.data(), slots.data(), n, n_heads, p, q_fused.data());
        EXPECT_EQ(q_fused, q) << "neox " << neox;
        EXPECT_EQ(std::memcmp(k_fused->data(), k_ref->data(), cache_bytes), 0) << "neox " << neox;
        EXPECT_EQ(std::memcmp(v_fused->data(), v_ref->data(), cache_bytes), 0) << "neox " << neox;
        // And token by token through the reference op.
        std::vector<float> q_ref(q.size()), cos_sin(static_cast<size_t>(p.rope_dim));
        std::vector<float> k_scratch(static_cast<size_t>(kvw));
        for (int64_t t = 0; t < n; ++t) {
          ref::rope_store_qkv_row(ref_kv, qkv.data() + t * row, static_cast<float>(positions[static_cast<size_t>(t)]),
                                  slots[static_cast<size_t>(t)], n_heads, p, q_ref.data() + t * qw, cos_sin.data(),
                                  k_scratch.data());
        }
        EXPECT_EQ(q_fused, q_ref) << "neox " << neox << " far " << far;
        EXPECT_EQ(std::memcmp(k_fused->data(), k_ref->data(), cache_bytes), 0) << "neox " << neox << " far " << far;
      }
    }
  }
}

// What the backend stores is what its attention reads: K and V rows stored at scattered slots through store_kv,
// then attention for tokens at several positions, against attention computed densely from the float rows (f32
// cache, so no rounding on the way in). Pages of 16 (whole key blocks per page) and 5 (blocks gathered across
// pages). K sits transposed in its page where kv_layout.h says.
TEST(CpuOps, StoredCacheAttendsLikeDenseAttention) {
  CpuBackend backend(2);
  const int64_t n_heads = 6, n_kv = 2, hd = 32, ctx = 37, group = n_heads / n_kv;
  for (int64_t page : {16, 5}) {
    const int64_t blocks = (ctx + page - 1) / page, num_blocks = blocks + 2, kvw = n_kv * hd;
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(num_blocks - 1 - b);
    std::vector<int32_t> slots(static_cast<size_t>(ctx));
    for (int64_t j = 0; j < ctx; ++j) slots[static_cast<size_t>(j)] = table[static_cast<size_t>(j / page)] * page + j % page;
    const auto k = normal_values(static_cast<size_t>(ctx * kvw), 11), v = normal_values(k.size(), 12);
    const size_t cache_bytes = static_cast<size_t>(num_blocks * page * kvw) * sizeof(float);
    auto k_cache = backend.allocate(cache_bytes), v_cache = backend.allocate(cache_bytes);
    const KvLayerView kv{k_cache->data(), v_cache->data(), DType::kF32, num_blocks, page, n_kv, hd};
    backend.store_kv(kv, k.data(), v.data(), slots.data(), ctx);
    const auto* stored_k = static_cast<const float*>(k_cache->data());
    EXPECT_EQ(stored_k[k_cache_index(kv, slots[20], 1, 7)], k[static_cast<size_t>(20 * kvw + hd + 7)]);
    // Three tokens of one sequence (positions 36, 17, 0) and one of another reading the same blocks (position 30).
    const std::vector<int32_t> positions = {36, 17, 0, 30}, seq = {0, 0, 0, 1};
    std::vector<int32_t> tables(table);
    tables.insert(tables.end(), table.begin(), table.end());
    const AttentionBatch batch{4, positions.data(), seq.data(), tables.data(), blocks};
    const auto q = normal_values(static_cast<size_t>(4 * n_heads * hd), 13);
    std::vector<float> out(q.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    backend.attention(kv, batch, q.data(), n_heads, scale, out.data());
    for (int64_t t = 0; t < 4; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t n_ctx = positions[static_cast<size_t>(t)] + 1, kh = h / group;
        const float* qh = q.data() + (t * n_heads + h) * hd;
        std::vector<double> w(static_cast<size_t>(n_ctx));
        double max_score = -1e300, sum = 0.0;
        for (int64_t j = 0; j < n_ctx; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += qh[d] * k[static_cast<size_t>(j * kvw + kh * hd + d)];
          w[static_cast<size_t>(j)] = dot * scale;
          max_score = std::max(max_score, w[static_cast<size_t>(j)]);
        }
        for (double& x : w) sum += (x = std::exp(x - max_score));
        for (int64_t d = 0; d < hd; ++d) {
          double want = 0.0;
          for (int64_t j = 0; j < n_ctx; ++j) want += w[static_cast<size_t>(j)] / sum * v[static_cast<size_t>(j * kvw + kh * hd + d)];
          ASSERT_NEAR(out[static_cast<size_t>((t * n_heads + h) * hd + d)], want, 1e-5)
              << "page " << page << " token " << t << " head " << h << " dim " << d;
        }
      }
    }
  }
}

// The backend's per-position cos/sin table gives the reference rotation bit for bit, while positions grow the
// table, for both pair layouts, after a parameter change (rebuilt), and for positions past the table (fallback).
TEST(CpuOps, BackendRopeTableEqualsReference) {
  CpuBackend backend(2);
  const std::vector<std::vector<int32_t>> batches = {{5, 0, 300, 7}, {1000, 2, 3}, {70000, 4}, {9, 1}};
  for (float theta : {10000.0f, 500000.0f}) {
    for (bool neox : {false, true}) {
      RopeParams p;
      p.head_dim = 64;
      p.rope_dim = 48;
      p.theta = theta;
      p.neox = neox;
      for (const auto& positions : batches) {
        const auto n = static_cast<int64_t>(positions.size());
        const int64_t n_heads = 3;
        std::vector<float> x(static_cast<size_t>(n * n_heads * p.head_dim));
        std::iota(x.begin(), x.end(), -50.0f);
        auto want = x;
        ref::rope(want.data(), positions.data(), n, n_heads, p);
        backend.rope(x.data(), positions.data(), n, n_heads, p);
        ASSERT_EQ(x, want) << "theta " << theta << " neox " << neox << " first position " << positions[0];
      }
    }
  }
}

// Embedding rows of k-quant tables are their dequantized rows (core/quant.h, checked against gguf.quants by
// test_quant); Q5_K's are also spelled out here from ggml's block_q5_K layout: element 32j + l of a super-block is
// d·scale_j·q − dmin·min_j with q the nibble of qs[32(j/2) + l] (low for even j) plus 16 for bit j of qh[l].
TEST(CpuOps, EmbedKQuantRows) {
  CpuBackend backend(2);
  std::mt19937 rng(17);
  for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    const int64_t rows = 11, cols = 768;
    const int64_t row_bytes = *dtype_row_bytes(type, cols);
    const int64_t block_bytes = dtype_info(type).type_size;
    std::vector<uint8_t> table(static_cast<size_t>(rows * row_bytes));
    for (uint8_t& b : table) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> scale(0.001f, 0.02f);
    for (int64_t off = 0; off < static_cast<int64_t>(table.size()); off += block_bytes) {
      const uint16_t d = f32_to_fp16(scale(rng)), dmin = f32_to_fp16(scale(rng));
      std::memcpy(&table[static_cast<size_t>(off + (type == DType::kQ6_K ? block_bytes - 2 : 0))], &d, 2);
      if (type != DType::kQ6_K) std::memcpy(&table[static_cast<size_t>(off + 2)], &dmin, 2);
    }
    const WeightMatrix w{table.data(), type, rows, cols, row_bytes};
    const std::vector<int32_t> ids = {3, 0, 10, 3};
    std::vector<float> out(ids.size() * cols);
    backend.embed(w, ids.data(), static_cast<int64_t>(ids.size()), out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint8_t* row = table.data() + ids[i] * row_bytes;
      std::vector<float> want(static_cast<size_t>(cols));
      dequantize_row(type, row, want.data(), cols);
      ASSERT_EQ(std::memcmp(out.data() + i * cols, want.data(), want.size() * sizeof(float)), 0) << "id " << ids[i];
      if (type != DType::kQ5_K) continue;
      for (int64_t e = 0; e < cols; ++e) {
        BlockQ5_K blk;
        std::memcpy(&blk, row + e / 256 * block_bytes, sizeof blk);
        const int j = static_cast<int>(e % 256 / 32), l = static_cast<int>(e % 32);
        const uint8_t* s = blk.scales;
        const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
        const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        const int nibble = j % 2 == 0 ? blk.qs[32 * (j / 2) + l] & 0xF : blk.qs[32 * (j / 2) + l] >> 4;
        const int q = nibble + ((blk.qh[l] >> j) & 1) * 16;
        const float d1 = fp16_to_f32(blk.d) * static_cast<float>(sc);
        const float m1 = fp16_to_f32(blk.dmin) * static_cast<float>(mn);
        const float v = d1 * static_cast<float>(q);
        ASSERT_EQ(out[i * cols + static_cast<size_t>(e)], v - m1) << "id " << ids[i] << " element " << e;
      }
    }
    const int32_t bad = static_cast<int32_t>(rows);
    EXPECT_THROW(backend.embed(w, &bad, 1, out.data()), Error);
  }
}

// make_resident faults every page of a buffer in (mincore sees them all) and leaves what was written untouched, for
// a small heap buffer and for a mapped one of several huge pages with an odd size.
TEST(CpuOps, MakeResidentBacksEveryPageAndKeepsContents) {
  CpuBackend backend(2);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t bytes : {size_t{100}, (size_t{7} << 20) + 17}) {
    auto buffer = backend.allocate(bytes);
    auto* data = static_cast<uint8_t*>(buffer->data());
    const std::vector<size_t> written = {0, bytes / 3, bytes - 1};
    for (size_t at : written) data[at] = static_cast<uint8_t>(at % 251 + 1);
    backend.make_resident(*buffer);
    for (size_t at : written) EXPECT_EQ(data[at], static_cast<uint8_t>(at % 251 + 1)) << bytes << " bytes, at " << at;
    const auto start = reinterpret_cast<uintptr_t>(data) / page * page;
    const size_t span = reinterpret_cast<uintptr_t>(data) + bytes - start;
    std::vector<unsigned char> resident((span + page - 1) / page);
    ASSERT_EQ(mincore(reinterpret_cast<void*>(start), span, resident.data()), 0) << std::strerror(errno);
    const auto missing = std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1) == 0; });
    EXPECT_EQ(missing, 0) << bytes << " bytes: pages not resident";
  }
}

}  // namespace
}  // namespace servetune::cpu
