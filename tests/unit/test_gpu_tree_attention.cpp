// Draft-tree attention (AttentionBatch::tree_base / tree_mask) and copy_kv_slots on the GPU backend against the CPU
// backend on the same cache contents (the CPU's tree attention equals each root-to-leaf path attended alone:
// test_tree_attention.cpp). A tree of 11 nodes after a context, in one batch with another sequence's ordinary tokens:
// GQA through the single-pass kernel (per head, and grouped when the batch is big), and the flash-decoding split with
// a context of 1000; MLA latent caches (DeepSeek-V3's 512 + 64 rows and the tiny model's 32 + 8), unsplit and split;
// f32, f16 and bf16 caches. Then the accepted path moved to consecutive positions by copy_kv_slots on both backends
// and attended causally there; and copy_kv_slots' bytes for chained pairs (a pair reading an earlier pair's dst, more
// pairs than one launch carries). Skips, saying why, when no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/gpu_backend.h"
#include "core/error.h"
#include "gpu_test_support.h"

namespace servetune {
namespace {

using gpu_test::bf16_rounded;
using gpu_test::random_floats;
using gpu_test::rel_error;

// The tree: node 0 is the root (cache index `context`), node i's parent kParents[i] (a parent comes first).
const std::vector<int32_t> kParents = {-1, 0, 0, 1, 1, 2, 3, 3, 5, 0, 8};
constexpr int32_t kAccepted = 10;  // the leaf whose path (0 -> 2 -> 5 -> 8 -> 10) is accepted

std::vector<int32_t> path_to(int32_t node) {
  std::vector<int32_t> path;
  for (int32_t n = node; n >= 0; n = kParents[static_cast<size_t>(n)]) path.insert(path.begin(), n);
  return path;
}

struct Geometry {
  bool latent = false;
  int64_t n_heads = 4, n_kv = 2, head_dim = 64, v_dim = 64;  // latent: head_dim is the row width, n_kv 1
  DType dtype = DType::kF32;
  int64_t page = 16;
  int64_t context = 13;  // committed positions before the tree's root (and the other sequence's length)
  int64_t other = 1;     // the other sequence's tokens in the batch: its last `other` positions
  int64_t row() const { return latent ? head_dim : n_kv * head_dim; }
  int64_t q_width() const { return n_heads * head_dim; }
  int64_t out_width() const { return n_heads * (latent ? v_dim : head_dim); }
  std::string name() const {
    return std::string(latent ? "latent" : "gqa") + " " + std::string(dtype_name(dtype)) + " heads " +
           std::to_string(n_heads) + "/" + std::to_string(n_kv) + " width " + std::to_string(head_dim) + " page " +
           std::to_string(page) + " context " + std::to_string(context) + " other tokens " + std::to_string(other);
  }
};

// The same rows in a CPU cache (f32 holding bf16-rounded values for a bf16 GPU cache) and a GPU cache.
class GpuTreeAttention : public gpu_test::GpuFixture {
 protected:
  struct Caches {
    std::unique_ptr<Buffer> ck, cv;
    KvLayerView cpu, gpu;
  };
  Caches make_caches(const Geometry& g, int64_t num_blocks, const std::vector<int32_t>& slots, uint32_t seed) {
    const auto rows = static_cast<int64_t>(slots.size());
    const bool bf16 = g.dtype == DType::kBF16;
    auto k = random_floats(static_cast<size_t>(rows * g.row()), seed);
    auto v = random_floats(static_cast<size_t>(rows * g.row()), seed + 1);
    if (bf16) {
      k = bf16_rounded(k);
      v = bf16_rounded(v);
    }
    const DType cpu_dtype = bf16 ? DType::kF32 : g.dtype;
    const int64_t slots_total = num_blocks * g.page;
    Caches c;
    const auto cpu_bytes = static_cast<size_t>(slots_total * g.row()) * dtype_info(cpu_dtype).type_size;
    const auto gpu_bytes = static_cast<size_t>(slots_total * g.row()) * dtype_info(g.dtype).type_size;
    c.ck = cpu_.allocate(cpu_bytes);
    std::memset(c.ck->data(), 0, cpu_bytes);
    void* gk = dev(std::vector<uint8_t>(gpu_bytes, 0));
    void* gv = nullptr;
    if (!g.latent) {
      c.cv = cpu_.allocate(cpu_bytes);
      std::memset(c.cv->data(), 0, cpu_bytes);
      gv = dev(std::vector<uint8_t>(gpu_bytes, 0));
    }
    const int64_t heads = g.latent ? 1 : g.n_kv;
    c.cpu = {c.ck->data(), c.cv ? c.cv->data() : nullptr, cpu_dtype, num_blocks, g.page, heads, g.head_dim};
    c.gpu = {gk, gv, g.dtype, num_blocks, g.page, heads, g.head_dim};
    if (g.latent) {  // a row is [latent (v_dim) | rotary key]: k's rows split in two
      std::vector<float> latent, rope;
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = k.data() + r * g.row();
        latent.insert(latent.end(), row, row + g.v_dim);
        rope.insert(rope.end(), row + g.v_dim, row + g.row());
      }
      cpu_.store_latent(c.cpu, latent.data(), g.v_dim, rope.data(), slots.data(), rows);
      gpu_->store_latent(c.gpu, dev(latent), g.v_dim, dev(rope), dev(slots), rows);
    } else {
      cpu_.store_kv(c.cpu, k.data(), v.data(), slots.data(), rows);
      gpu_->store_kv(c.gpu, dev(k), dev(v), dev(slots), rows);
    }
    return c;
  }
  // One attention call on each backend (batch arrays host on the CPU, uploaded for the GPU); the GPU's output
  // checked against the CPU's, which is returned with the GPU's.
  std::pair<std::vector<float>, std::vector<float>> attend(const Geometry& g, const Caches& c, int64_t n,
                                                           const std::vector<int32_t>& positions,
                                                           const std::vector<int32_t>& seq,
                                                           const std::vector<int32_t>& tables, int64_t max_blocks,
                                                           const std::vector<int32_t>& base,
                                                           const std::vector<uint64_t>& mask,
                                                           const std::vector<float>& q, const std::string& what) {
    const bool tree = !mask.empty();
    const AttentionBatch cb{n, positions.data(), seq.data(), tables.data(), max_blocks, tree ? base.data() : nullptr,
                            tree ? mask.data() : nullptr};
    const AttentionBatch gb{n, dev(positions), dev(seq), dev(tables), max_blocks, tree ? dev(base) : nullptr,
                            tree ? dev(mask) : nullptr};
    const float scale = g.latent ? 1.0f / std::sqrt(192.0f) : 1.0f / std::sqrt(static_cast<float>(g.head_dim));
    std::vector<float> want(static_cast<size_t>(n * g.out_width()));
    float* out = dev(std::vector<float>(want.size(), 0.0f));
    if (g.latent) {
      cpu_.attention_latent(c.cpu, cb, q.data(), g.n_heads, g.v_dim, scale, want.data());
      gpu_->attention_latent(c.gpu, gb, dev(q), g.n_heads, g.v_dim, scale, out);
    } else {
      cpu_.attention(c.cpu, cb, q.data(), g.n_heads, scale, want.data());
      gpu_->attention(c.gpu, gb, dev(q), g.n_heads, scale, out);
    }
    std::vector<float> got = host(out, want.size());
    const std::string chunks = g.latent ? "" : " chunks " + std::to_string(gpu_attention_chunks(c.gpu, gb, g.n_heads));
    EXPECT_LT(rel_error(got, want), g.latent ? 2e-5 : 1e-5) << what << chunks;
    // Row by row too: one tree node's output must not hide behind another's larger values.
    const int64_t w = g.out_width();
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<float> a(got.begin() + t * w, got.begin() + (t + 1) * w), b(want.begin() + t * w, want.begin() + (t + 1) * w);
      EXPECT_LT(rel_error(a, b), g.latent ? 2e-5 : 1e-5) << what << " token " << t << chunks;
    }
    return {got, want};
  }
  // The tree check for `g`; returns the chunks the GPU split the tree batch into (GQA; 0 for latent).
  int64_t check(const Geometry& g);

  cpu::CpuBackend cpu_{2};
};

int64_t GpuTreeAttention::check(const Geometry& g) {
  SCOPED_TRACE(g.name());
  const auto nodes = static_cast<int64_t>(kParents.size());
  const int64_t max_blocks = (g.context + nodes + g.page - 1) / g.page, num_blocks = 2 * max_blocks + 1;
  std::mt19937 rng(static_cast<uint32_t>(g.context + g.n_heads + g.page));
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);  // pages out of order, block 0 in either table
  std::vector<int32_t> tables(pool.begin(), pool.begin() + 2 * max_blocks);
  const auto slot = [&](int64_t s, int64_t index) {
    return tables[static_cast<size_t>(s * max_blocks + index / g.page)] * static_cast<int32_t>(g.page) +
           static_cast<int32_t>(index % g.page);
  };
  // Rows: sequence 0's context and tree nodes, sequence 1's context.
  std::vector<int32_t> slots;
  for (int64_t i = 0; i < g.context + nodes; ++i) slots.push_back(slot(0, i));
  for (int64_t i = 0; i < g.context; ++i) slots.push_back(slot(1, i));
  const Caches c = make_caches(g, num_blocks, slots, static_cast<uint32_t>(g.head_dim));

  // The batch: the tree's nodes (position: the root's plus depth), then sequence 1's last `other` positions.
  std::vector<int32_t> positions, seq, base;
  std::vector<uint64_t> mask;
  for (int64_t i = 0; i < nodes; ++i) {
    const std::vector<int32_t> path = path_to(static_cast<int32_t>(i));
    uint64_t bits = 0;
    for (const int32_t p : path) bits |= uint64_t{1} << p;
    positions.push_back(static_cast<int32_t>(g.context + static_cast<int64_t>(path.size()) - 1));
    seq.push_back(0);
    base.push_back(static_cast<int32_t>(g.context));
    mask.push_back(bits);
  }
  for (int64_t p = g.context - g.other; p < g.context; ++p) {
    positions.push_back(static_cast<int32_t>(p));
    seq.push_back(1);
    base.push_back(0);
    mask.push_back(0);
  }
  const auto n = static_cast<int64_t>(positions.size());
  const auto q = random_floats(static_cast<size_t>(n * g.q_width()), 7, -1.0f, 1.0f);
  const auto [tree_out, cpu_tree_out] = attend(g, c, n, positions, seq, tables, max_blocks, base, mask, q, "tree batch");
  int64_t chunks = 0;
  if (!g.latent) {
    const AttentionBatch shape{n, positions.data(), seq.data(), tables.data(), max_blocks, base.data(), mask.data()};
    chunks = gpu_attention_chunks(c.gpu, shape, g.n_heads);
  }

  // Accept the path to kAccepted: its rows move to the indices right after the root on both backends, and plain
  // causal attention there gives each path node's tree output.
  const std::vector<int32_t> path = path_to(kAccepted);
  std::vector<int32_t> src, dst;
  for (size_t k = 1; k < path.size(); ++k) {
    src.push_back(slot(0, g.context + path[k]));
    dst.push_back(slot(0, g.context + static_cast<int64_t>(k)));
  }
  cpu_.copy_kv_slots(c.cpu, src.data(), dst.data(), static_cast<int64_t>(src.size()));
  gpu_->copy_kv_slots(c.gpu, src.data(), dst.data(), static_cast<int64_t>(src.size()));
  std::vector<int32_t> path_positions, path_seq;
  std::vector<float> path_q;
  for (size_t k = 0; k < path.size(); ++k) {
    path_positions.push_back(static_cast<int32_t>(g.context + static_cast<int64_t>(k)));
    path_seq.push_back(0);
    path_q.insert(path_q.end(), q.begin() + path[k] * g.q_width(), q.begin() + (path[k] + 1) * g.q_width());
  }
  const auto path_n = static_cast<int64_t>(path.size());
  const auto [moved, cpu_moved] = attend(g, c, path_n, path_positions, path_seq, tables, max_blocks, {}, {}, path_q,
                                         "accepted path after copy_kv_slots");
  std::vector<float> tree_rows;
  for (const int32_t node : path) {
    tree_rows.insert(tree_rows.end(), tree_out.begin() + node * g.out_width(), tree_out.begin() + (node + 1) * g.out_width());
  }
  EXPECT_LT(rel_error(moved, tree_rows), g.latent ? 2e-5 : 1e-5) << "the moved path against its tree outputs (GPU)";
  return chunks;
}

// A GQA geometry (pages of 16) and a latent one (one row of `width` per slot, its first v_dim values the latent).
Geometry gqa(DType dtype, int64_t n_heads, int64_t n_kv, int64_t head_dim, int64_t context) {
  Geometry g;
  g.dtype = dtype;
  g.n_heads = n_heads;
  g.n_kv = n_kv;
  g.head_dim = head_dim;
  g.v_dim = head_dim;
  g.context = context;
  return g;
}
Geometry latent(DType dtype, int64_t n_heads, int64_t width, int64_t v_dim, int64_t page, int64_t context) {
  Geometry g = gqa(dtype, n_heads, 1, width, context);
  g.latent = true;
  g.v_dim = v_dim;
  g.page = page;
  return g;
}

TEST_F(GpuTreeAttention, GqaSinglePassSmallAndGroupedBatches) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    Geometry small = gqa(dtype, 4, 2, 64, 13);
    small.page = 3;
    EXPECT_EQ(check(small), 1);
    Geometry smollm2 = gqa(dtype, 9, 3, 64, 13);  // SmolLM2-135M's heads
    EXPECT_EQ(check(smollm2), 1);
    smollm2.context = 300;
    smollm2.other = 120;  // (11 + 120) tokens x 3 KV heads: the grouped single-pass kernel
    EXPECT_EQ(check(smollm2), 1);
    EXPECT_EQ(check(gqa(dtype, 6, 3, 40, 1000)), 1);  // a head size the split kernel does not take
    Geometry root_first = gqa(dtype, 4, 2, 64, 0);    // no context: the root is cache index 0
    root_first.other = 0;
    EXPECT_EQ(check(root_first), 1);
  }
}

TEST_F(GpuTreeAttention, GqaSplitLongContexts) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_GT(check(gqa(dtype, 9, 3, 64, 1000)), 1) << "a small batch with a context of 1000 takes the split kernel";
    EXPECT_GT(check(gqa(dtype, 32, 8, 128, 1000)), 1);  // Llama-3-8B's heads
  }
}

TEST_F(GpuTreeAttention, LatentDeepSeekV3RowsAndTinyRows) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    check(latent(dtype, 128, 576, 512, 16, 13));    // DeepSeek-V3's 128 heads over 512 + 64 rows; 24 rows: one pass
    check(latent(dtype, 128, 576, 512, 16, 1000));  // 12 tokens x 8 head groups with 1000 positions: split
    check(latent(dtype, 4, 40, 32, 5, 13));         // deepseek_v3_mtp_tiny's rows (32 + 8), 4 heads
    check(latent(dtype, 4, 40, 32, 5, 1000));
  }
}

// copy_kv_slots' bytes: pairs in order (slot i + 1 gets slot i's row after slot i got slot i - 1's, so the whole chain
// ends holding slot 0's row), more pairs than one launch carries, then unrelated pairs; GQA (K and V) and latent rows.
TEST_F(GpuTreeAttention, CopyKvSlotsInOrderChainedPairs) {
  struct Case {
    bool latent;
    DType dtype;
    int64_t n_kv, head_dim;
  };
  for (const Case& cs : {Case{false, DType::kF16, 3, 64}, Case{false, DType::kF32, 8, 128}, Case{false, DType::kBF16, 2, 40},
                         Case{true, DType::kBF16, 1, 576}, Case{true, DType::kF32, 1, 40}}) {
    SCOPED_TRACE(std::string(cs.latent ? "latent " : "gqa ") + std::string(dtype_name(cs.dtype)));
    const int64_t page = 16, num_blocks = 12, slots = num_blocks * page;
    const auto row_bytes = static_cast<size_t>(cs.n_kv * cs.head_dim) * dtype_info(cs.dtype).type_size;
    const size_t bytes = static_cast<size_t>(slots) * row_bytes;
    std::mt19937 rng(5);
    std::vector<uint8_t> k(bytes), v(bytes);
    for (auto& b : k) b = static_cast<uint8_t>(rng());
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    uint8_t* gk = dev(k);
    uint8_t* gv = cs.latent ? nullptr : dev(v);
    const KvLayerView view{gk, gv, cs.dtype, num_blocks, page, cs.n_kv, cs.head_dim};
    std::vector<int32_t> src, dst;
    for (int32_t i = 0; i < 70; ++i) {  // the chain 0 -> 1 -> ... -> 70
      src.push_back(i);
      dst.push_back(i + 1);
    }
    for (int32_t i = 0; i < 10; ++i) {  // unrelated pairs after it, one back onto the chain
      src.push_back(static_cast<int32_t>(100 + 3 * i));
      dst.push_back(static_cast<int32_t>(i == 9 ? 5 : 150 + i));
    }
    gpu_->copy_kv_slots(view, src.data(), dst.data(), static_cast<int64_t>(src.size()));
    for (size_t i = 0; i < src.size(); ++i) {
      std::memmove(k.data() + static_cast<size_t>(dst[i]) * row_bytes, k.data() + static_cast<size_t>(src[i]) * row_bytes, row_bytes);
      std::memmove(v.data() + static_cast<size_t>(dst[i]) * row_bytes, v.data() + static_cast<size_t>(src[i]) * row_bytes, row_bytes);
    }
    EXPECT_TRUE(host<uint8_t>(gk, bytes) == k) << "K / latent rows";
    if (!cs.latent) {
      EXPECT_TRUE(host<uint8_t>(gv, bytes) == v) << "V rows";
    }
    // A slot outside the cache is refused before anything runs.
    const int32_t bad_src = 0, bad_dst = static_cast<int32_t>(slots);
    EXPECT_THROW(gpu_->copy_kv_slots(view, &bad_src, &bad_dst, 1), Error);
  }
}

}  // namespace
}  // namespace servetune
