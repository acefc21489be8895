// The GPU backend's mixture-of-experts and latent-attention (MLA) ops against the CPU backend on the same inputs:
// scatter_add_rows with repeated rows (exact order per row, so within float rounding of one FMA), expert_mlps with
// experts of 0, 1 and many rows (f32 weights within 1e-5, bf16 within 1e-2; the grouped kernel, one cuBLAS GEMM per
// expert, the tiled GEMM), device routing (group_by_expert against route_tokens and a stable sort, for DeepSeek-V3,
// -V2, Qwen3-MoE and Mixtral rules) and expert_mlps_grouped against expert_mlps, head_matmul on DeepSeek-V3's
// absorption shapes with strided inputs and outputs (the gaps between heads left alone), copy_rows,
// store_latent (the cache bytes themselves, f32 / f16 / bf16) and attention_latent on 576-wide rows (512 latent + 64
// rope), 128 heads, v_dim 512 and 128, contexts 1, 17 and 1000 and a prefill chunk, pages of 16 and 256, both the
// split (few blocks) and the unsplit kernel paths. Skips, saying why, when no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/moe_routing.h"
#include "core/half.h"
#include "core/quant.h"
#include "gpu_test_support.h"

namespace servetune {
namespace {

using gpu_test::bf16_bits;
using gpu_test::bf16_rounded;
using gpu_test::random_floats;
using gpu_test::rel_error;

class GpuMoeOps : public gpu_test::GpuFixture {
 protected:
  // A weight matrix [rows, cols] of `values` on the device, as f32 or bf16; `cpu_values` gets what the CPU backend
  // should multiply by (the same matrix in the same type, host memory).
  struct Weights {
    WeightMatrix device, host;
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
  };
  Weights weights(int64_t rows, int64_t cols, DType type, uint32_t seed) {
    Weights w;
    w.f32 = random_floats(static_cast<size_t>(rows * cols), seed, -0.1f, 0.1f);
    const int64_t elem = type == DType::kF32 ? 4 : 2;
    if (type == DType::kBF16) {
      w.bf16 = bf16_bits(w.f32);
      w.device = WeightMatrix{dev(w.bf16), type, rows, cols, cols * elem};
    } else {
      w.device = WeightMatrix{dev(w.f32), type, rows, cols, cols * elem};
    }
    w.host = w.device;
    w.host.data = type == DType::kBF16 ? static_cast<const void*>(w.bf16.data()) : static_cast<const void*>(w.f32.data());
    return w;
  }
  void check_latent_attention(DType dtype, int64_t n_heads, int64_t width, int64_t v_dim, int64_t page,
                              bool prefill_chunk);
  void check_expert_mlps(int64_t hidden, int64_t ffn, const std::vector<int64_t>& counts);
};

TEST_F(GpuMoeOps, ScatterAddRowsRepeatedRowsInOrder) {
  // (entries, width, destination rows): one entry; a decode step's top-8 of 4 tokens; many entries on few rows (more
  // than one tile of entries, several destination groups); a DeepSeek-V3-wide prefill chunk.
  for (auto [n, width, dest] : {std::tuple<int64_t, int64_t, int64_t>{1, 33, 3}, {32, 7168, 4}, {700, 300, 9},
                                {2048, 7168, 256}}) {
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::vector<int32_t> rows(static_cast<size_t>(n));
    for (auto& r : rows) r = static_cast<int32_t>(rng() % dest);
    const auto src = random_floats(static_cast<size_t>(n * width), 1);
    const auto weights = random_floats(static_cast<size_t>(n), 2, 0.0f, 1.0f);
    const auto start = random_floats(static_cast<size_t>(dest * width), 3);
    cpu::CpuBackend cpu(2);
    std::vector<float> expected = start;
    cpu.scatter_add_rows(src.data(), rows.data(), weights.data(), n, width, expected.data());
    float* out = dev(start);
    gpu_->scatter_add_rows(dev(src), dev(rows), dev(weights), n, width, out);
    // Same adds in the same order per value; only whether a product is fused into its add may differ.
    EXPECT_LT(rel_error(host(out, expected.size()), expected), 1e-6) << n << " entries, width " << width;
  }
}

// expert_mlps over experts of `counts` rows (in order, as the model's counting sort makes them) of shape
// [ffn, hidden] / [hidden, ffn], f32 and bf16 weights, against the CPU: by default (bf16: the grouped tensor-core
// kernel), with one cuBLAS GEMM per expert (SERVETUNE_GPU_MOE=loop) and through the tiled GEMM.
void GpuMoeOps::check_expert_mlps(int64_t hidden, int64_t ffn, const std::vector<int64_t>& counts) {
  const std::pair<const char*, const char*> modes[] = {{"", ""}, {"SERVETUNE_GPU_MOE", "loop"}, {"SERVETUNE_GPU_GEMM", "tiled"}};
  for (DType type : {DType::kF32, DType::kBF16}) {
    for (const auto& [name, value] : modes) {
      if (name[0] != '\0') setenv(name, value, 1);
      std::unique_ptr<Backend> backend = make_backend(gpu_backend_name(), 1);
      if (name[0] != '\0') unsetenv(name);
      std::vector<Weights> w;
      std::vector<Backend::ExpertMlp> on_cpu, on_gpu;
      w.reserve(3 * counts.size());
      int64_t n = 0;
      for (size_t e = 0; e < counts.size(); ++e) {
        const auto seed = static_cast<uint32_t>(10 + 3 * e);
        w.push_back(weights(ffn, hidden, type, seed));
        w.push_back(weights(ffn, hidden, type, seed + 1));
        w.push_back(weights(hidden, ffn, type, seed + 2));
        on_cpu.push_back({&w[3 * e].host, &w[3 * e + 1].host, &w[3 * e + 2].host, n, counts[e]});
        on_gpu.push_back({&w[3 * e].device, &w[3 * e + 1].device, &w[3 * e + 2].device, n, counts[e]});
        n += counts[e];
      }
      const auto x = random_floats(static_cast<size_t>(n * hidden), 5);
      cpu::CpuBackend cpu(2);
      std::vector<float> expected(static_cast<size_t>(n * hidden));
      cpu.expert_mlps(on_cpu, x.data(), expected.data());
      float* y = dev(std::vector<float>(expected.size(), 0.0f));
      gpu_->synchronize();  // the uploads ran on the fixture's stream
      backend->expert_mlps(on_gpu, dev(x), y);
      backend->synchronize();
      EXPECT_LT(rel_error(host(y, expected.size()), expected), type == DType::kF32 ? 1e-5 : 1e-2)
          << dtype_name(type) << " " << name << "=" << value << ", hidden " << hidden << ", ffn " << ffn;
    }
  }
}

// Expert 0 none, expert 1 one row, expert 2 seventeen, expert 3 twenty-three on DeepSeek-V2-Lite's expert shape: a
// decode-like call (16-row tiles).
TEST_F(GpuMoeOps, ExpertMlpsZeroOneAndManyRows) { check_expert_mlps(2048, 1408, {0, 1, 17, 23}); }

// Prefill-like counts (64-row tiles: 130 = two whole tiles and a partial one) on a shape whose input widths are not
// multiples of the kernel's 64-column stages (720, 400) and whose outputs end inside a 64-column block.
TEST_F(GpuMoeOps, ExpertMlpsPrefillRowsAndPartialBlocks) { check_expert_mlps(720, 400, {130, 0, 64, 70}); }

// group_by_expert against the host: route_tokens, then a stable sort of the assignments by expert. Logits are a
// per-token permutation of values 0.03 apart (and the selection bias under half that), so no two experts' keys are
// within a rounding of each other and the device's expf picks the same experts as the host's.
TEST_F(GpuMoeOps, GroupByExpertMatchesTheHostRouting) {
  MoeRouting v3{256, 8, MoeScoring::kSigmoid, 8, 4, MoeGroupScore::kTopTwoSum, true, 2.5f};  // DeepSeek-V3
  MoeRouting qwen3{128, 8, MoeScoring::kSoftmax, 1, 1, MoeGroupScore::kMax, true, 1.0f};
  MoeRouting mixtral{8, 2, MoeScoring::kSoftmax, 1, 1, MoeGroupScore::kMax, true, 1.0f};
  MoeRouting v2{160, 6, MoeScoring::kSoftmax, 8, 3, MoeGroupScore::kMax, false, 16.0f};  // group-limited greedy
  if (!gpu_->routes_on_device(v3)) GTEST_SKIP() << "this GPU backend routes on the host (HIP, or a switch set)";
  std::mt19937 rng(21);
  for (const MoeRouting& r : {v3, qwen3, mixtral, v2}) {
    for (int64_t n : {1, 7, 300, 2000}) {
      SCOPED_TRACE(std::to_string(r.n_experts) + " experts, top " + std::to_string(r.top_k) + ", " + std::to_string(n) +
                   " tokens");
      const int64_t E = r.n_experts, count = n * r.top_k;
      std::vector<float> logits(static_cast<size_t>(n * E));
      std::vector<int32_t> perm(static_cast<size_t>(E));
      for (int64_t t = 0; t < n; ++t) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int64_t e = 0; e < E; ++e) {
          logits[static_cast<size_t>(t * E + e)] = 0.03f * static_cast<float>(perm[static_cast<size_t>(e)] - E / 2);
        }
      }
      const auto bias = random_floats(static_cast<size_t>(E), 22, -0.001f, 0.001f);
      const bool biased = r.scoring == MoeScoring::kSigmoid;
      std::vector<int32_t> ids(static_cast<size_t>(count));
      std::vector<float> weights(static_cast<size_t>(count));
      route_tokens(r, logits.data(), biased ? bias.data() : nullptr, n, ids.data(), weights.data());
      std::vector<int32_t> order(static_cast<size_t>(count));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
      int32_t* rows = dev(std::vector<int32_t>(static_cast<size_t>(count), -1));
      float* got_weights = dev(std::vector<float>(static_cast<size_t>(count), 0.0f));
      int32_t* offsets = dev(std::vector<int32_t>(static_cast<size_t>(E + 1), -1));
      // With `real` tokens of n grouped (a padded graph step: the rest stay in place, weight 0), the expected rows,
      // weights and offsets against the device's.
      for (const int64_t real : {n, n - 3}) {
        if (real != n && n < 7) continue;  // the padded variant from 7 tokens on
        const int64_t grouped = real * r.top_k;
        std::vector<int32_t> want_rows, want_offsets(static_cast<size_t>(E + 1), 0);
        std::vector<float> want_weights;
        for (const int32_t i : order) {
          if (i >= grouped) continue;
          want_rows.push_back(i / static_cast<int32_t>(r.top_k));
          want_weights.push_back(weights[static_cast<size_t>(i)]);
          ++want_offsets[static_cast<size_t>(ids[static_cast<size_t>(i)]) + 1];
        }
        for (int64_t e = 0; e < E; ++e) want_offsets[static_cast<size_t>(e + 1)] += want_offsets[static_cast<size_t>(e)];
        for (int64_t i = grouped; i < count; ++i) {
          want_rows.push_back(static_cast<int32_t>(i / r.top_k));
          want_weights.push_back(0.0f);
        }
        const int32_t* real_tokens = real == n ? nullptr : dev(std::vector<int32_t>{static_cast<int32_t>(real)});
        gpu_->group_by_expert(r, dev(logits), biased ? dev(bias) : nullptr, n, real_tokens, rows, got_weights, offsets);
        EXPECT_EQ(host<int32_t>(offsets, static_cast<size_t>(E + 1)), want_offsets) << real << " real tokens";
        EXPECT_EQ(host<int32_t>(rows, static_cast<size_t>(count)), want_rows) << real << " real tokens";
        EXPECT_LT(rel_error(host(got_weights, static_cast<size_t>(count)), want_weights), 1e-5) << real << " real tokens";
      }
    }
  }
}

// expert_mlps_grouped (runs given as device offsets) equals expert_mlps over the same runs bit for bit: bf16 experts
// through the grouped kernel with a plan made on the device (16- and 64-row tiles), f32 experts through the host
// fallback (offsets downloaded, one GEMM per expert).
TEST_F(GpuMoeOps, ExpertMlpsGroupedEqualsExpertMlps) {
  const int64_t hidden = 256, ffn = 192;
  for (DType type : {DType::kBF16, DType::kF32}) {
    for (const std::vector<int64_t>& counts : {std::vector<int64_t>{0, 3, 1, 0, 2, 9}, {130, 0, 64, 70, 1, 0}}) {
      std::vector<Weights> w;
      w.reserve(3 * counts.size());
      std::vector<Backend::ExpertMlp> runs;
      std::vector<Backend::ExpertWeights> experts;
      std::vector<int32_t> offsets{0};
      for (size_t e = 0; e < counts.size(); ++e) {
        const auto seed = static_cast<uint32_t>(40 + 3 * e);
        w.push_back(weights(ffn, hidden, type, seed));
        w.push_back(weights(ffn, hidden, type, seed + 1));
        w.push_back(weights(hidden, ffn, type, seed + 2));
        runs.push_back({&w[3 * e].device, &w[3 * e + 1].device, &w[3 * e + 2].device, offsets.back(), counts[e]});
        experts.push_back({&w[3 * e].device, &w[3 * e + 1].device, &w[3 * e + 2].device});
        offsets.push_back(offsets.back() + static_cast<int32_t>(counts[e]));
      }
      const int64_t rows = offsets.back();
      const float* x = dev(random_floats(static_cast<size_t>(rows * hidden), 41));
      float* want = dev(std::vector<float>(static_cast<size_t>(rows * hidden), 0.0f));
      float* got = dev(std::vector<float>(static_cast<size_t>(rows * hidden), 0.0f));
      gpu_->expert_mlps(runs, x, want);
      gpu_->expert_mlps_grouped(experts, dev(offsets), rows, x, got);
      EXPECT_EQ(host(got, static_cast<size_t>(rows * hidden)), host(want, static_cast<size_t>(rows * hidden)))
          << dtype_name(type) << ", " << rows << " rows";
    }
  }
}

// MLA's two absorptions on DeepSeek-V3's shapes: q_nope [n, heads, 192 (128 nope + 64 rope)] through W_UK^T per
// head into q_absorbed [n, heads, 576]'s first 512 values, and the latent output [n, heads, 512] through W_UV into
// [n, heads, 128]. Values between the heads' outputs (the rotary part) must stay as they were.
TEST_F(GpuMoeOps, HeadMatmulDeepSeekAbsorptionShapes) {
  const int64_t heads = 128, nope = 128, rope = 64, rank = 512, v_head = 128, hd = nope + rope, row = rank + rope;
  for (DType type : {DType::kF32, DType::kBF16}) {
    for (const char* gemm : {"", "tiled"}) {
      if (gemm[0] != '\0') setenv("SERVETUNE_GPU_GEMM", gemm, 1);
      std::unique_ptr<Backend> backend = make_backend(gpu_backend_name(), 1);
      unsetenv("SERVETUNE_GPU_GEMM");
      for (int64_t n : {1, 7}) {
        SCOPED_TRACE(std::string(dtype_name(type)) + " gemm '" + gemm + "' n " + std::to_string(n));
        cpu::CpuBackend cpu(2);
        // Absorbing W_UK: x strides {heads * hd, hd}, y strides {heads * row, row}.
        const Weights uk = weights(heads * rank, nope, type, 30);
        const auto q = random_floats(static_cast<size_t>(n * heads * hd), 31);
        const auto start = random_floats(static_cast<size_t>(n * heads * row), 32);
        std::vector<float> expected = start;
        cpu.head_matmul(uk.host, heads, q.data(), {heads * hd, hd}, n, expected.data(), {heads * row, row});
        float* y = dev(start);
        gpu_->synchronize();  // the uploads ran on the fixture's stream
        backend->head_matmul(uk.device, heads, dev(q), {heads * hd, hd}, n, y, {heads * row, row});
        backend->synchronize();
        EXPECT_LT(rel_error(host(y, expected.size()), expected), type == DType::kF32 ? 1e-5 : 1e-2) << "W_UK";
        // W_UV: contiguous heads.
        const Weights uv = weights(heads * v_head, rank, type, 33);
        const auto latent = random_floats(static_cast<size_t>(n * heads * rank), 34);
        std::vector<float> want(static_cast<size_t>(n * heads * v_head));
        cpu.head_matmul(uv.host, heads, latent.data(), {heads * rank, rank}, n, want.data(), {heads * v_head, v_head});
        float* out = dev(std::vector<float>(want.size(), 0.0f));
        gpu_->synchronize();
        backend->head_matmul(uv.device, heads, dev(latent), {heads * rank, rank}, n, out, {heads * v_head, v_head});
        backend->synchronize();
        EXPECT_LT(rel_error(host(out, want.size()), want), type == DType::kF32 ? 1e-5 : 1e-2) << "W_UV";
      }
    }
  }
}

TEST_F(GpuMoeOps, CopyRowsStrided) {
  // q's rotary parts (64 of each 192) into q_absorbed's (after 512 of each 576), and one row alone.
  for (auto [n, width, src_stride, dst_stride] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{7 * 128, 64, 192, 576},
                                                  {1, 100, 3, 5}, {5, 300, 300, 300}}) {
    const auto src = random_floats(static_cast<size_t>((n - 1) * src_stride + width), 40);
    const auto start = random_floats(static_cast<size_t>((n - 1) * dst_stride + width), 41);
    std::vector<float> expected = start;
    cpu::CpuBackend cpu(1);
    cpu.copy_rows(src.data(), src_stride, expected.data(), dst_stride, n, width);
    float* dst = dev(start);
    gpu_->copy_rows(dev(src), src_stride, dst, dst_stride, n, width);
    EXPECT_EQ(host(dst, expected.size()), expected) << n << " rows of " << width;
  }
}

// Sequences with contexts of 1, 17 and 1000 positions decoding one token each, plus (prefill_chunk) a fourth sequence
// running 40 tokens of a chunk at positions 60..99; block tables scattered over the pool. The CPU backend (f32 cache
// for a bf16 one, fed the bf16-rounded rows, so both hold the same values) gives the expected output; the GPU
// cache's bytes must equal the expected cache's.
void GpuMoeOps::check_latent_attention(DType dtype, int64_t n_heads, int64_t width, int64_t v_dim, int64_t page,
                                       bool prefill_chunk) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " heads " + std::to_string(n_heads) + " width " + std::to_string(width) +
               " v_dim " + std::to_string(v_dim) + " page " + std::to_string(page) +
               (prefill_chunk ? " with a prefill chunk" : " decode"));
  std::vector<int64_t> contexts = {1, 17, 1000};
  if (prefill_chunk) contexts.push_back(100);
  const auto n_seqs = static_cast<int64_t>(contexts.size());
  const int64_t max_blocks = (1000 + page - 1) / page, num_blocks = n_seqs * max_blocks + 1;
  std::mt19937 rng(static_cast<uint32_t>(page + n_heads));
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(n_seqs * max_blocks), -1);
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int64_t b = 0; b < (contexts[static_cast<size_t>(s)] + page - 1) / page; ++b) {
      tables[static_cast<size_t>(s * max_blocks + b)] = pool[static_cast<size_t>(s * max_blocks + b)];
    }
  }
  // Every position of every sequence gets a row; the batch's tokens are the last (decode) or the last 40 (the chunk).
  std::vector<int32_t> slots, positions, seq_of_token;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t ctx = contexts[static_cast<size_t>(s)], fresh = s == 3 ? 40 : 1;
    for (int64_t p = 0; p < ctx; ++p) {
      slots.push_back(tables[static_cast<size_t>(s * max_blocks + p / page)] * static_cast<int32_t>(page) +
                      static_cast<int32_t>(p % page));
      if (p >= ctx - fresh) {
        positions.push_back(static_cast<int32_t>(p));
        seq_of_token.push_back(static_cast<int32_t>(s));
      }
    }
  }
  const auto rows = static_cast<int64_t>(slots.size()), n = static_cast<int64_t>(positions.size());
  const int64_t latent_width = v_dim, rope_width = width - latent_width;
  const bool bf16 = dtype == DType::kBF16;
  auto latent = random_floats(static_cast<size_t>(rows * latent_width), 50);
  auto rope_key = random_floats(static_cast<size_t>(rows * rope_width), 51);
  if (bf16) {
    latent = bf16_rounded(latent);
    rope_key = bf16_rounded(rope_key);
  }
  const auto q = random_floats(static_cast<size_t>(n * n_heads * width), 52, -0.5f, 0.5f);
  const float scale = 1.0f / std::sqrt(192.0f);

  cpu::CpuBackend cpu(2);
  const DType cpu_dtype = bf16 ? DType::kF32 : dtype;
  const int64_t cpu_row_bytes = width * dtype_info(cpu_dtype).type_size, row_bytes = width * dtype_info(dtype).type_size;
  auto cpu_cache = cpu.allocate(static_cast<size_t>(num_blocks * page * cpu_row_bytes));
  std::fill_n(static_cast<uint8_t*>(cpu_cache->data()), cpu_cache->size(), 0);
  const KvLayerView cpu_kv{cpu_cache->data(), nullptr, cpu_dtype, num_blocks, page, 1, width};
  cpu.store_latent(cpu_kv, latent.data(), latent_width, rope_key.data(), slots.data(), rows);
  std::vector<float> expected(static_cast<size_t>(n * n_heads * v_dim));
  cpu.attention_latent(cpu_kv, AttentionBatch{n, positions.data(), seq_of_token.data(), tables.data(), max_blocks},
                       q.data(), n_heads, v_dim, scale, expected.data());

  const size_t cache_bytes = static_cast<size_t>(num_blocks * page * row_bytes);
  uint8_t* gpu_cache = dev(std::vector<uint8_t>(cache_bytes, 0));
  const KvLayerView gpu_kv{gpu_cache, nullptr, dtype, num_blocks, page, 1, width};
  gpu_->store_latent(gpu_kv, dev(latent), latent_width, dev(rope_key), dev(slots), rows);
  float* out = dev(std::vector<float>(expected.size(), 0.0f));
  gpu_->attention_latent(gpu_kv, AttentionBatch{n, dev(positions), dev(seq_of_token), dev(tables), max_blocks}, dev(q),
                         n_heads, v_dim, scale, out);
  EXPECT_LT(rel_error(host(out, expected.size()), expected), 2e-5);

  // The cache itself: the CPU's bytes for f32 / f16; for bf16 the rows' bf16 bits (exact: the rows are bf16 values).
  const auto stored = host<uint8_t>(gpu_cache, cache_bytes);
  if (!bf16) {
    EXPECT_TRUE(std::equal(stored.begin(), stored.end(), static_cast<const uint8_t*>(cpu_cache->data())));
    return;
  }
  const auto* cpu_rows = static_cast<const float*>(cpu_cache->data());
  size_t mismatches = 0;
  for (int64_t i = 0; i < num_blocks * page * width; ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, stored.data() + 2 * i, 2);
    mismatches += bits != f32_to_bf16(cpu_rows[i]) ? 1 : 0;
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(GpuMoeOps, LatentAttentionDeepSeekV3RowsPage16And256) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t page : {16, 256}) {
      check_latent_attention(dtype, 128, 576, 512, page, false);  // 3 tokens x 8 head groups: the split path
      check_latent_attention(dtype, 128, 576, 512, page, true);   // 43 tokens x 8 groups: unsplit
    }
  }
}

TEST_F(GpuMoeOps, LatentAttentionNarrowValuesOddHeadsTinyRows) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    check_latent_attention(dtype, 128, 576, 128, 16, false);  // v_dim 128 of a 576 row
    check_latent_attention(dtype, 20, 576, 512, 16, true);    // heads not a multiple of a block's group
    check_latent_attention(dtype, 4, 40, 32, 16, false);      // the tiny DeepSeek test model's rows (32 + 8)
    check_latent_attention(dtype, 16, 72, 64, 256, true);
  }
}

}  // namespace
}  // namespace servetune
