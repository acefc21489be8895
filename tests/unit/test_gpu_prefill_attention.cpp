// The tensor-core prefill attention (backend/cuda/prefill_attention_mma.cu) against the CPU backend's attention: a
// 2048-token prompt (Llama-3-8B's 32/8 heads, head_dim 128, pages of 16 and 256), a batch mixing decode tokens, a chunk
// continuing 500 cached positions and two short prompts (GQA 32/8, MHA 8/8, 32/2), and SmolLM2's 9/3 heads at
// head_dim 64; f16 and bf16 caches. Skips without a GPU (the dispatch rule's test needs none).
// Tolerance, per output row (token, head) relative to the row's largest |value|: Q and P are rounded to the cache's
// type for the mma (bf16: 8 significant bits, unit roundoff u = 2^-8 = 3.9e-3; f16: 11 bits, u = 2^-11 = 4.9e-4), K and
// V are the same values on both sides. P's rounding perturbs each softmax weight by up to u (relative) and Q's each
// score by about u * scale * |q . k| terms (~1.5e-3 in bf16 here), independently per key, so a row's error is about u
// of its magnitude, a little more at its worst: 2e-2 for bf16 (5 u), 3e-3 for f16 (6 u).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/gpu_backend.h"
#include "gpu_test_support.h"

namespace servetune {
namespace {

using gpu_test::random_floats;

// A sequence of the batch: `cached` positions already in the cache, `fresh` new tokens (in batch order).
struct Seq {
  int64_t cached;
  int64_t fresh;
};

struct Shape {
  int64_t n_heads, n_kv, head_dim;
};

// The largest per-row error (see the file comment) of `got` against `want`, rows of head_dim values.
double worst_row_error(const std::vector<float>& got, const std::vector<float>& want, int64_t head_dim) {
  double worst = 0.0;
  for (size_t r = 0; r + head_dim <= want.size(); r += static_cast<size_t>(head_dim)) {
    double diff = 0.0, scale = 1e-30;
    for (size_t d = r; d < r + static_cast<size_t>(head_dim); ++d) {
      diff = std::max(diff, std::fabs(static_cast<double>(got[d]) - want[d]));
      scale = std::max(scale, std::fabs(static_cast<double>(want[d])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

class GpuPrefillAttention : public gpu_test::GpuFixture {
 protected:
  // The batch of `seqs` (in order) on both backends; the GPU's result for each page size within the tolerance of the
  // CPU's (computed once: it does not depend on the page size). Block tables interleave the sequences' pages.
  void check(DType kv_dtype, Shape shape, const std::vector<Seq>& seqs, const std::vector<int64_t>& pages) {
    std::vector<int32_t> positions, seq_of_token;
    std::vector<std::pair<int64_t, int64_t>> old_tokens;  // (sequence, position) of the cached ones
    for (size_t s = 0; s < seqs.size(); ++s) {
      for (int64_t p = 0; p < seqs[s].cached + seqs[s].fresh; ++p) {
        if (p < seqs[s].cached) {
          old_tokens.emplace_back(static_cast<int64_t>(s), p);
          continue;
        }
        positions.push_back(static_cast<int32_t>(p));
        seq_of_token.push_back(static_cast<int32_t>(s));
      }
    }
    const auto n = static_cast<int64_t>(positions.size()), n_old = static_cast<int64_t>(old_tokens.size());
    const int64_t width = shape.n_kv * shape.head_dim;
    const auto k_old = random_floats(static_cast<size_t>(n_old * width), 30);
    const auto v_old = random_floats(static_cast<size_t>(n_old * width), 31);
    const auto k_new = random_floats(static_cast<size_t>(n * width), 32);
    const auto v_new = random_floats(static_cast<size_t>(n * width), 33);
    const auto q = random_floats(static_cast<size_t>(n * shape.n_heads * shape.head_dim), 34, -2.0f, 2.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    const bool bf16 = kv_dtype == DType::kBF16;

    const std::vector<float> expected = run(Side::kCpu, bf16 ? DType::kF32 : kv_dtype, shape, seqs, 16, positions,
                                            seq_of_token, old_tokens, bf16, k_old, v_old, k_new, v_new, q, scale);
    for (int64_t page : pages) {
      const std::vector<float> got = run(Side::kGpu, kv_dtype, shape, seqs, page, positions, seq_of_token, old_tokens,
                                         false, k_old, v_old, k_new, v_new, q, scale);
      EXPECT_LT(worst_row_error(got, expected, shape.head_dim), bf16 ? 2e-2 : 3e-3)
          << dtype_name(kv_dtype) << " heads " << shape.n_heads << "/" << shape.n_kv << " head_dim " << shape.head_dim
          << " page " << page << " tokens " << n;
    }
  }

 private:
  enum class Side { kCpu, kGpu };
  // Stores the cached and new K/V through store_kv and runs attention on the CPU (round: K/V rounded to bf16 first,
  // for an f32 CPU cache standing for a bf16 one) or on the GPU; returns the output.
  std::vector<float> run(Side side, DType dtype, Shape shape, const std::vector<Seq>& seqs, int64_t page,
                         const std::vector<int32_t>& positions, const std::vector<int32_t>& seq_of_token,
                         const std::vector<std::pair<int64_t, int64_t>>& old_tokens, bool round,
                         const std::vector<float>& k_old, const std::vector<float>& v_old, const std::vector<float>& k_new,
                         const std::vector<float>& v_new, const std::vector<float>& q, float scale) {
    const auto n_seqs = static_cast<int64_t>(seqs.size());
    int64_t longest = 1;
    for (const Seq& s : seqs) longest = std::max(longest, s.cached + s.fresh);
    const int64_t max_blocks = (longest + page - 1) / page, num_blocks = n_seqs * max_blocks;
    std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
    for (int64_t s = 0; s < n_seqs; ++s) {
      for (int64_t b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = static_cast<int32_t>(b * n_seqs + (n_seqs - 1 - s));
    }
    const auto slot = [&](int64_t s, int64_t p) { return static_cast<int32_t>(tables[s * max_blocks + p / page] * page + p % page); };
    std::vector<int32_t> old_slots, new_slots;
    for (const auto& [s, p] : old_tokens) old_slots.push_back(slot(s, p));
    for (size_t t = 0; t < positions.size(); ++t) new_slots.push_back(slot(seq_of_token[t], positions[t]));
    const auto prepared = [&](const std::vector<float>& v) { return round ? gpu_test::bf16_rounded(v) : v; };
    const auto n = static_cast<int64_t>(positions.size()), n_old = static_cast<int64_t>(old_slots.size());
    const size_t cache_bytes =
        static_cast<size_t>(num_blocks * page * shape.n_kv * shape.head_dim) * (dtype == DType::kF32 ? 4 : 2);
    std::vector<float> out(q.size());
    if (side == Side::kCpu) {
      cpu::CpuBackend cpu(8);
      auto k = cpu.allocate(cache_bytes), v = cpu.allocate(cache_bytes);
      const KvLayerView kv{k->data(), v->data(), dtype, num_blocks, page, shape.n_kv, shape.head_dim};
      cpu.store_kv(kv, prepared(k_old).data(), prepared(v_old).data(), old_slots.data(), n_old);
      cpu.store_kv(kv, prepared(k_new).data(), prepared(v_new).data(), new_slots.data(), n);
      cpu.attention(kv, AttentionBatch{n, positions.data(), seq_of_token.data(), tables.data(), max_blocks}, q.data(),
                    shape.n_heads, scale, out.data());
      return out;
    }
    auto k = gpu_->allocate(cache_bytes), v = gpu_->allocate(cache_bytes);
    const KvLayerView kv{k->data(), v->data(), dtype, num_blocks, page, shape.n_kv, shape.head_dim};
    gpu_->store_kv(kv, dev(k_old), dev(v_old), dev(old_slots), n_old);
    gpu_->store_kv(kv, dev(k_new), dev(v_new), dev(new_slots), n);
    const AttentionBatch batch{n, dev(positions), dev(seq_of_token), dev(tables), max_blocks};
    EXPECT_TRUE(gpu_attention_tensor_cores(kv, batch, shape.n_heads)) << "the batch should take the tensor-core kernel";
    float* result = dev(std::vector<float>(q.size(), NAN));
    gpu_->attention(kv, batch, dev(q), shape.n_heads, scale, result);
    return host(result, q.size());
  }
};

// Decode tokens (contexts 100, 1001, 64), a chunk of 300 continuing 500 cached positions, prompts of 70 and 5.
const std::vector<Seq> kMixed = {{99, 1}, {500, 300}, {0, 70}, {1000, 1}, {0, 5}, {63, 1}};

TEST_F(GpuPrefillAttention, Prompt2048Llama8BShape) {
  for (DType dtype : {DType::kBF16, DType::kF16}) check(dtype, {32, 8, 128}, {{0, 2048}}, {16, 256});
}

TEST_F(GpuPrefillAttention, MixedChunkPromptsAndDecodeTokens) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    check(dtype, {32, 8, 128}, kMixed, {16, 256});
    check(dtype, {8, 8, 64}, kMixed, {16});    // MHA: 64 tokens per tile
    check(dtype, {32, 2, 128}, kMixed, {16});  // 16 query heads per KV head: 4 tokens per tile
  }
}

TEST_F(GpuPrefillAttention, SmolLM2Heads) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    check(dtype, {9, 3, 64}, {{0, 200}}, {16, 256});
    check(dtype, {9, 3, 64}, kMixed, {16});
  }
}

// Which calls take the tensor-core kernel (host logic; no GPU needed).
TEST(GpuPrefillAttentionDispatch, PrefillSizedF16Bf16BatchesWithoutTreesOnly) {
  alignas(16) static char cache[16];
  const AttentionBatch big{64, nullptr, nullptr, nullptr, 1};
  const KvLayerView bf16{cache, cache, DType::kBF16, 1, 16, 8, 128};
  EXPECT_EQ(gpu_attention_tensor_cores(bf16, big, 32), std::string(gpu_backend_name()) == "cuda");
  EXPECT_FALSE(gpu_attention_tensor_cores(bf16, AttentionBatch{63, nullptr, nullptr, nullptr, 1}, 32));
  KvLayerView f32 = bf16;
  f32.dtype = DType::kF32;
  EXPECT_FALSE(gpu_attention_tensor_cores(f32, big, 32));
  KvLayerView wide = bf16;
  wide.head_dim = 256;
  EXPECT_FALSE(gpu_attention_tensor_cores(wide, big, 32));
  EXPECT_FALSE(gpu_attention_tensor_cores(bf16, big, 8 * 65));  // more than 64 query heads per KV head
  const uint64_t mask[1] = {1};
  const int32_t base[1] = {0};
  AttentionBatch tree = big;
  tree.tree_base = base;
  tree.tree_mask = mask;
  EXPECT_FALSE(gpu_attention_tensor_cores(bf16, tree, 32));
}

}  // namespace
}  // namespace servetune
