// CPU ops other than matmul against their plain C++ reference: the SIMD attention kernels on random paged caches of
// awkward sizes (head dims, context lengths, GQA ratios, page sizes, scattered block tables), and rope invariants.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/attention_simd.h"
#include "backend/cpu/ops_reference.h"
#include "core/cpu_features.h"

namespace servetune::cpu {
namespace {

using HeadKernel = void (*)(const KvLayerView&, const AttentionBatch&, const float*, int64_t, float, int64_t, int64_t,
                            float*, float*);

void check_attention(HeadKernel kernel, int64_t multiple) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t hd : {8, 16, 32, 64, 128}) {
    if (hd % multiple != 0) continue;
    for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}, {9, 3}}) {
      for (int64_t page : {1, 5, 16}) {
        const int64_t n_ctx = 1 + static_cast<int64_t>(rng() % 300);
        const int64_t blocks = (n_ctx + page - 1) / page;
        const int64_t num_blocks = blocks + 3;
        std::vector<float> k(static_cast<size_t>(num_blocks * page * n_kv * hd)), v(k.size());
        for (auto& x : k) x = normal(rng);
        for (auto& x : v) x = normal(rng);
        std::vector<int32_t> table(static_cast<size_t>(blocks));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng);  // blocks scattered in the cache
        KvLayerView kv{k.data(), v.data(), DType::kF32, num_blocks, page, n_kv, hd};
        // Two tokens of one sequence: the last position and one in the middle.
        std::vector<int32_t> positions = {static_cast<int32_t>(n_ctx - 1), static_cast<int32_t>((n_ctx - 1) / 2)};
        std::vector<int32_t> seq = {0, 0};
        AttentionBatch batch{2, positions.data(), seq.data(), table.data(), blocks};
        std::vector<float> q(static_cast<size_t>(2 * n_heads * hd));
        for (auto& x : q) x = normal(rng);
        std::vector<float> scratch(static_cast<size_t>(n_ctx)), want(static_cast<size_t>(hd)), got(want.size());
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        for (int64_t t = 0; t < 2; ++t) {
          for (int64_t h = 0; h < n_heads; ++h) {
            ref::attention_head(kv, batch, q.data(), n_heads, scale, t, h, scratch.data(), want.data());
            kernel(kv, batch, q.data(), n_heads, scale, t, h, scratch.data(), got.data());
            for (int64_t d = 0; d < hd; ++d) {
              ASSERT_NEAR(got[static_cast<size_t>(d)], want[static_cast<size_t>(d)], 1e-5f)
                  << "hd " << hd << " heads " << n_heads << "/" << n_kv << " page " << page << " ctx " << n_ctx;
            }
          }
        }
      }
    }
  }
}

TEST(CpuOps, AttentionAvx512MatchesReference) {
  if (!cpu_supports(CpuIsa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  check_attention(&detail::attention_head_f32_avx512, 16);
}

TEST(CpuOps, AttentionAvx2MatchesReference) {
  if (!cpu_supports(CpuIsa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  check_attention(&detail::attention_head_f32_avx2, 8);
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

}  // namespace
}  // namespace servetune::cpu
