// The SIMD latent attention (MLA) kernels against the scalar reference on paged latent caches (f32, f16, FP8; pages
// of 1, 5 and 16 slots; scattered block tables): runs of consecutive tokens (causal inside the run), more (token,
// head) lanes than one pass holds, and a token's result independent of the run and head range it was computed in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/latent_attention.h"
#include "core/cpu_features.h"
#include "core/quant.h"

namespace servetune::cpu {
namespace {

void check_latent(LatentAttentionKernel kernel, DType kv_dtype) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // (row width, value width, heads): the tiny DeepSeek's 32 + 8, an odd width, a DeepSeek-shaped row with many heads.
  for (auto [width, v_dim, n_heads] : {std::tuple<int64_t, int64_t, int64_t>{40, 32, 4}, {37, 21, 3}, {72, 64, 20}}) {
    for (int64_t page : {1, 5, 16}) {
      SCOPED_TRACE("width " + std::to_string(width) + " heads " + std::to_string(n_heads) + " page " + std::to_string(page));
      const int64_t run = 11, first = static_cast<int64_t>(rng() % 40), span = first + run;
      const int64_t blocks = (span + page - 1) / page, num_blocks = blocks + 2;
      const int64_t row_bytes = width * dtype_info(kv_dtype).type_size;
      std::vector<uint8_t> cache(static_cast<size_t>(num_blocks * page * row_bytes));
      std::vector<float> row(static_cast<size_t>(width));
      for (int64_t slot = 0; slot < num_blocks * page; ++slot) {
        for (float& x : row) x = normal(rng);
        quantize_row(kv_dtype, row.data(), cache.data() + slot * row_bytes, width);
      }
      std::vector<int32_t> table(static_cast<size_t>(blocks));
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      const KvLayerView kv{cache.data(), nullptr, kv_dtype, num_blocks, page, 1, width};
      std::vector<int32_t> positions(static_cast<size_t>(run)), seq(static_cast<size_t>(run), 0);
      std::iota(positions.begin(), positions.end(), static_cast<int32_t>(first));
      const AttentionBatch batch{run, positions.data(), seq.data(), table.data(), blocks};
      std::vector<float> q(static_cast<size_t>(run * n_heads * width));
      for (float& x : q) x = normal(rng);
      const size_t out_size = static_cast<size_t>(run * n_heads * v_dim);
      std::vector<float> want(out_size), whole(out_size), alone(out_size), split(out_size);
      const LatentAttentionItem item{&kv, &batch, q.data(), n_heads, v_dim, 0.2f, nullptr};
      LatentAttentionScratch scratch;
      auto with_out = [&](std::vector<float>& out) {
        LatentAttentionItem i = item;
        i.out = out.data();
        return i;
      };
      detail::latent_attention_reference(with_out(want), 0, run, 0, n_heads, scratch);
      kernel(with_out(whole), 0, run, 0, n_heads, scratch);  // the whole run at once
      for (int64_t t = 0; t < run; ++t) {
        kernel(with_out(alone), t, t + 1, 0, n_heads, scratch);  // each token on its own, as in decode
      }
      const int64_t cut = n_heads / 2 + 1;  // two runs and two head ranges
      for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, 4}, {4, run}}) {
        kernel(with_out(split), t0, t1, 0, cut, scratch);
        kernel(with_out(split), t0, t1, cut, n_heads, scratch);
      }
      for (size_t i = 0; i < out_size; ++i) {
        ASSERT_NEAR(whole[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << "output " << i;
        ASSERT_EQ(alone[i], whole[i]) << "output " << i << " differs when its token runs alone";
        ASSERT_EQ(split[i], whole[i]) << "output " << i << " differs in another run or head range";
      }
    }
  }
}

// Contexts longer than a position block go through partials merged in block order: a decode token seeing 3 blocks
// and a prefill run across a block boundary (its first tokens do not see the next block at all), through the backend
// op on 1, 2 and 3 threads: the same bits on each, near the reference.
TEST(CpuLatentAttention, LongContextsSplitByPositionBlockMatchReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int64_t width = 72, v_dim = 64, n_heads = 6, page = 16;
  const int64_t decode_pos = 2 * kLatentPositionBlock + 300, run_first = kLatentPositionBlock - 4, run = 8;
  const int64_t blocks_per_seq = (decode_pos + 1 + page - 1) / page, num_blocks = 2 * blocks_per_seq;
  std::vector<uint16_t> cache(static_cast<size_t>(num_blocks * page * width));
  std::vector<float> row(static_cast<size_t>(width));
  for (size_t slot = 0; slot < cache.size() / width; ++slot) {
    for (float& x : row) x = normal(rng);
    quantize_row(DType::kF16, row.data(), cache.data() + slot * width, width);
  }
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  const KvLayerView kv{cache.data(), nullptr, DType::kF16, num_blocks, page, 1, width};
  // Token 0: sequence 0's decode token; tokens 1..8: sequence 1's prefill run.
  std::vector<int32_t> positions = {static_cast<int32_t>(decode_pos)}, seq = {0};
  for (int64_t i = 0; i < run; ++i) {
    positions.push_back(static_cast<int32_t>(run_first + i));
    seq.push_back(1);
  }
  const int64_t n = 1 + run;
  const AttentionBatch batch{n, positions.data(), seq.data(), tables.data(), blocks_per_seq};
  std::vector<float> q(static_cast<size_t>(n * n_heads * width));
  for (float& x : q) x = normal(rng);
  const size_t out_size = static_cast<size_t>(n * n_heads * v_dim);
  std::vector<float> want(out_size);
  LatentAttentionScratch scratch;
  const LatentAttentionItem ref_item{&kv, &batch, q.data(), n_heads, v_dim, 0.1f, want.data()};
  detail::latent_attention_reference(ref_item, 0, 1, 0, n_heads, scratch);
  detail::latent_attention_reference(ref_item, 1, n, 0, n_heads, scratch);
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    CpuBackend backend(threads);
    std::vector<float> got(out_size);
    backend.attention_latent(kv, batch, q.data(), n_heads, v_dim, 0.1f, got.data());
    for (size_t i = 0; i < out_size; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << "threads " << threads << " output " << i;
    }
    if (first.empty()) first = got;
    EXPECT_EQ(got, first) << threads << " threads";
  }
}

TEST(CpuLatentAttention, Avx512MatchesReference) {
  if (!cpu_supports(CpuIsa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  for (DType t : {DType::kF32, DType::kF16, DType::kFP8_E4M3}) check_latent(&detail::latent_attention_avx512, t);
}

TEST(CpuLatentAttention, Avx2MatchesReference) {
  if (!cpu_supports(CpuIsa::kAvx2)) GTEST_SKIP() << "this CPU has no AVX2";
  for (DType t : {DType::kF32, DType::kF16, DType::kFP8_E4M3}) check_latent(&detail::latent_attention_avx2, t);
}

}  // namespace
}  // namespace servetune::cpu
