// Draft-tree attention (AttentionBatch::tree_mask) against a reference that runs each root-to-leaf path on its own:
// every tree node's output equals (bit for bit) causal attention over the committed context followed by its ancestors, for GQA
// (the backend's choice, the scalar reference, AVX2, AVX-512) and MLA latent caches (the same kernels), in a batch
// that also holds an ordinary decode token; copy_kv_slots then moves a path to consecutive positions, after which
// plain causal attention there gives the same outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention_simd.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/latent_attention.h"
#include "backend/cpu/ops_reference.h"
#include "core/cpu_features.h"

namespace servetune::cpu {
namespace {

constexpr int64_t kContext = 13;  // committed positions before the tree's root
constexpr int64_t kPage = 5;
// The tree: node 0 is the root (cache index kContext), node i's parent kParents[i] (a parent comes first).
const std::vector<int32_t> kParents = {-1, 0, 0, 1, 1, 2, 3, 3, 5, 0, 8};

struct Geometry {
  bool latent = false;
  int64_t n_heads = 4, n_kv = 2, head_dim = 32, v_dim = 32;  // latent: head_dim is the row width, n_kv 1
  DType dtype = DType::kF32;
  int64_t row() const { return latent ? head_dim : n_kv * head_dim; }  // values per cached slot (K or latent)
  int64_t out_width() const { return n_heads * (latent ? v_dim : head_dim); }
};

// A paged cache of `blocks` blocks (table 0..blocks-1 reversed, so pages are out of order).
struct Cache {
  std::unique_ptr<Buffer> k, v;
  KvLayerView view;
  std::vector<int32_t> table;
  Cache(CpuBackend& backend, const Geometry& g, int64_t blocks) {
    const size_t bytes = static_cast<size_t>(blocks * kPage * g.row()) * dtype_info(g.dtype).type_size;
    k = backend.allocate(bytes);
    if (!g.latent) v = backend.allocate(bytes);
    view = {k->data(), v ? v->data() : nullptr, g.dtype, blocks, kPage, g.latent ? 1 : g.n_kv, g.head_dim};
    for (int64_t b = blocks - 1; b >= 0; --b) table.push_back(static_cast<int32_t>(b));
  }
  int32_t slot(int64_t index) const { return table[static_cast<size_t>(index / kPage)] * kPage + static_cast<int32_t>(index % kPage); }
  // Stores rows (row i: keys/latent k[i], values v[i]) at cache indices `indices`.
  void store(CpuBackend& backend, const Geometry& g, const std::vector<int64_t>& indices, const std::vector<float>& k,
             const std::vector<float>& v) {
    std::vector<int32_t> slots;
    for (const int64_t i : indices) slots.push_back(slot(i));
    const auto n = static_cast<int64_t>(slots.size());
    if (g.latent) {
      std::vector<float> latent, rope;
      for (int64_t t = 0; t < n; ++t) {
        const float* r = k.data() + t * g.row();
        latent.insert(latent.end(), r, r + g.v_dim);
        rope.insert(rope.end(), r + g.v_dim, r + g.row());
      }
      backend.store_latent(view, latent.data(), g.v_dim, rope.data(), slots.data(), n);
    } else {
      backend.store_kv(view, k.data(), v.data(), slots.data(), n);
    }
  }
};

using Attend = std::function<void(const KvLayerView&, const AttentionBatch&, const float* q, float* out)>;

// The kernels under test for a geometry: name and a call over a whole batch.
std::vector<std::pair<std::string, Attend>> kernels(CpuBackend& backend, const Geometry& g) {
  const float scale = 0.3f;
  std::vector<std::pair<std::string, Attend>> out;
  if (g.latent) {
    out.emplace_back("backend", [&backend, g, scale](const KvLayerView& kv, const AttentionBatch& b, const float* q, float* o) {
      backend.attention_latent(kv, b, q, g.n_heads, g.v_dim, scale, o);
    });
    std::vector<std::pair<std::string, LatentAttentionKernel>> named = {{"reference", &detail::latent_attention_reference}};
    if (cpu_supports(CpuIsa::kAvx2)) named.emplace_back("avx2", &detail::latent_attention_avx2);
    if (cpu_supports(CpuIsa::kAvx512)) named.emplace_back("avx512", &detail::latent_attention_avx512);
    for (const auto& [name, kernel] : named) {
      out.emplace_back(name, [kernel, g, scale](const KvLayerView& kv, const AttentionBatch& b, const float* q, float* o) {
        const LatentAttentionItem item{&kv, &b, q, g.n_heads, g.v_dim, scale, o};
        LatentAttentionScratch scratch;
        for (int64_t t = 0; t < b.n_tokens; ++t) kernel(item, t, t + 1, 0, g.n_heads, scratch);
      });
    }
    return out;
  }
  out.emplace_back("backend", [&backend, g, scale](const KvLayerView& kv, const AttentionBatch& b, const float* q, float* o) {
    backend.attention(kv, b, q, g.n_heads, scale, o);
  });
  out.emplace_back("reference", [g, scale](const KvLayerView& kv, const AttentionBatch& b, const float* q, float* o) {
    std::vector<float> scratch(256);
    for (int64_t t = 0; t < b.n_tokens; ++t) {
      for (int64_t h = 0; h < g.n_heads; ++h) ref::attention_head(kv, b, q, g.n_heads, scale, t, h, scratch.data(), o + (t * g.n_heads + h) * g.head_dim);
    }
  });
  std::vector<std::tuple<std::string, detail::AttentionGroupKernel, int64_t>> simd;
  if (cpu_supports(CpuIsa::kAvx2)) simd.emplace_back("avx2", &detail::attention_group_avx2, 8);
  if (cpu_supports(CpuIsa::kAvx512)) simd.emplace_back("avx512", &detail::attention_group_avx512, 16);
  for (const auto& [name, kernel, width] : simd) {
    if (!detail::attention_simd_supports(g.head_dim, width)) continue;
    out.emplace_back(name, [kernel, g, scale](const KvLayerView& kv, const AttentionBatch& b, const float* q, float* o) {
      std::vector<float> scratch(static_cast<size_t>(detail::attention_scratch_floats(g.n_heads, 256)));
      for (int64_t t = 0; t < b.n_tokens; ++t) kernel(kv, b, q, g.n_heads, scale, t, t + 1, 0, g.n_heads, scratch.data(), o);
    });
    // The same kernel over runs of a sequence's consecutive tokens (every tree node in one call), one head at a time.
    out.emplace_back(name + " runs", [kernel, g, scale](const KvLayerView& kv, const AttentionBatch& b, const float* q, float* o) {
      std::vector<float> scratch(static_cast<size_t>(detail::attention_scratch_floats(detail::kMaxRunTokens, 256)));
      for (int64_t t0 = 0, t1 = 0; t0 < b.n_tokens; t0 = t1) {
        for (t1 = t0 + 1; t1 < b.n_tokens && t1 - t0 < detail::kMaxRunTokens && b.seq_of_token[t1] == b.seq_of_token[t0];) ++t1;
        for (int64_t h = 0; h < g.n_heads; ++h) kernel(kv, b, q, g.n_heads, scale, t0, t1, h, 1, scratch.data(), o);
      }
    });
  }
  return out;
}

std::vector<float> normal_rows(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<int32_t> path_to(int32_t node) {
  std::vector<int32_t> path;
  for (int32_t n = node; n >= 0; n = kParents[static_cast<size_t>(n)]) path.insert(path.begin(), n);
  return path;
}

void check_tree(const Geometry& g) {
  CpuBackend backend(2);
  std::mt19937 rng(7);
  const auto nodes = static_cast<int64_t>(kParents.size());
  const int64_t rows = kContext + nodes, blocks = (rows + kPage - 1) / kPage + 1;
  const auto keys = normal_rows(rng, rows * g.row()), values = normal_rows(rng, rows * g.row());
  // Queries: one per tree node, then an ordinary decode token of another sequence at position kContext - 1.
  const int64_t n = nodes + 1, q_width = g.n_heads * g.head_dim;
  const auto q = normal_rows(rng, n * q_width);
  Cache tree(backend, g, blocks), other(backend, g, blocks);
  std::vector<int64_t> all(static_cast<size_t>(rows));
  std::iota(all.begin(), all.end(), 0);
  tree.store(backend, g, all, keys, values);
  other.store(backend, g, all, keys, values);
  std::vector<int32_t> positions, seq, base, tables = tree.table;
  std::vector<uint64_t> mask;
  tables.insert(tables.end(), tree.table.begin(), tree.table.end());
  for (int64_t i = 0; i < nodes; ++i) {
    const std::vector<int32_t> path = path_to(static_cast<int32_t>(i));
    uint64_t bits = 0;
    for (const int32_t p : path) bits |= uint64_t{1} << p;
    positions.push_back(static_cast<int32_t>(kContext + static_cast<int64_t>(path.size()) - 1));
    seq.push_back(0);
    base.push_back(static_cast<int32_t>(kContext));
    mask.push_back(bits);
  }
  positions.push_back(kContext - 1);
  seq.push_back(1);
  base.push_back(0);
  mask.push_back(0);
  const AttentionBatch batch{n, positions.data(), seq.data(), tables.data(), static_cast<int64_t>(tree.table.size()),
                             base.data(), mask.data()};

  for (const auto& [name, attend] : kernels(backend, g)) {
    SCOPED_TRACE(name + (g.latent ? " latent" : " gqa") + " head_dim " + std::to_string(g.head_dim));
    std::vector<float> got(static_cast<size_t>(n * g.out_width()));
    attend(tree.view, batch, q.data(), got.data());
    for (int64_t i = 0; i <= nodes; ++i) {
      // The reference: a fresh cache holding the context, then this node's path (root .. node) in order; causal.
      const bool decode = i == nodes;
      const std::vector<int32_t> path = decode ? std::vector<int32_t>{} : path_to(static_cast<int32_t>(i));
      Cache alone(backend, g, blocks);
      std::vector<int64_t> indices;
      std::vector<float> k, v;
      for (int64_t j = 0; j < kContext + static_cast<int64_t>(path.size()); ++j) {
        const int64_t from = j < kContext ? j : kContext + path[static_cast<size_t>(j - kContext)];
        indices.push_back(j);
        k.insert(k.end(), keys.begin() + from * g.row(), keys.begin() + (from + 1) * g.row());
        v.insert(v.end(), values.begin() + from * g.row(), values.begin() + (from + 1) * g.row());
      }
      alone.store(backend, g, indices, k, v);
      const int32_t position = decode ? kContext - 1 : static_cast<int32_t>(kContext + static_cast<int64_t>(path.size()) - 1);
      const int32_t zero = 0;
      const AttentionBatch one{1, &position, &zero, alone.table.data(), static_cast<int64_t>(alone.table.size())};
      std::vector<float> want(static_cast<size_t>(g.out_width()));
      attend(alone.view, one, q.data() + i * q_width, want.data());
      // Bit for bit: an accepted path's K/V must be what plain decoding computes, or greedy outputs could differ.
      for (int64_t c = 0; c < g.out_width(); ++c) {
        ASSERT_EQ(got[static_cast<size_t>(i * g.out_width() + c)], want[static_cast<size_t>(c)])
            << "node " << i << " value " << c;
      }
    }
  }

  // Accepting the path to node 10 (0 -> 2 -> 5 -> 8 -> 10): its nodes' tree outputs, then its rows moved to the
  // consecutive indices after the root, where plain causal attention gives the same outputs.
  const auto all_kernels = kernels(backend, g);
  const Attend& attend = all_kernels.front().second;
  std::vector<float> tree_out(static_cast<size_t>(n * g.out_width()));
  attend(tree.view, batch, q.data(), tree_out.data());
  const std::vector<int32_t> path = path_to(10);
  std::vector<int32_t> src, dst;
  for (size_t k = 1; k < path.size(); ++k) {
    src.push_back(tree.slot(kContext + path[k]));
    dst.push_back(tree.slot(kContext + static_cast<int64_t>(k)));
  }
  backend.copy_kv_slots(tree.view, src.data(), dst.data(), static_cast<int64_t>(src.size()));
  for (size_t k = 0; k < path.size(); ++k) {
    const auto position = static_cast<int32_t>(kContext + static_cast<int64_t>(k));
    const int32_t zero = 0;
    const AttentionBatch one{1, &position, &zero, tree.table.data(), static_cast<int64_t>(tree.table.size())};
    std::vector<float> got(static_cast<size_t>(g.out_width()));
    attend(tree.view, one, q.data() + path[k] * q_width, got.data());
    for (int64_t c = 0; c < g.out_width(); ++c) {
      ASSERT_EQ(got[static_cast<size_t>(c)], tree_out[static_cast<size_t>(path[k] * g.out_width() + c)])
          << "moved path node " << path[k] << " value " << c;
    }
  }
}

TEST(TreeAttention, GqaMatchesEachPathAlone) {
  check_tree({});
  Geometry smollm2;  // SmolLM2-135M's heads
  smollm2.n_heads = 9;
  smollm2.n_kv = 3;
  smollm2.head_dim = 64;
  check_tree(smollm2);
  Geometry f16;
  f16.dtype = DType::kF16;
  check_tree(f16);
  Geometry odd;  // a head size no SIMD kernel takes: the backend runs the reference
  odd.head_dim = 12;
  odd.n_heads = 6;
  odd.n_kv = 3;
  check_tree(odd);
}

TEST(TreeAttention, LatentMatchesEachPathAlone) {
  Geometry g;
  g.latent = true;
  g.n_heads = 4;
  g.head_dim = 40;
  g.v_dim = 32;
  check_tree(g);
  g.n_heads = 20;  // more (token, head) lanes than one pass holds
  g.dtype = DType::kF16;
  check_tree(g);
}

// A tree whose node sees a masked row of its own tree must not see it: flipping a sibling's row changes nothing.
TEST(TreeAttention, SiblingRowsAreInvisible) {
  CpuBackend backend(1);
  Geometry g;
  std::mt19937 rng(3);
  const int64_t rows = kContext + 3, blocks = (rows + kPage - 1) / kPage + 1;
  auto keys = normal_rows(rng, rows * g.row()), values = normal_rows(rng, rows * g.row());
  const auto q = normal_rows(rng, g.n_heads * g.head_dim);
  std::vector<int64_t> all(static_cast<size_t>(rows));
  std::iota(all.begin(), all.end(), 0);
  // Root at kContext, children at kContext + 1 and + 2: node 2 sees the root and itself only.
  const int32_t position = kContext + 1, zero = 0, tree_base = kContext;
  const uint64_t bits = 0b101;
  std::vector<float> first(static_cast<size_t>(g.out_width())), second(first.size());
  for (std::vector<float>* out : {&first, &second}) {
    Cache c(backend, g, blocks);
    c.store(backend, g, all, keys, values);
    const AttentionBatch b{1, &position, &zero, c.table.data(), static_cast<int64_t>(c.table.size()), &tree_base, &bits};
    backend.attention(c.view, b, q.data(), g.n_heads, 0.3f, out->data());
    for (int64_t i = 0; i < g.row(); ++i) keys[static_cast<size_t>((kContext + 1) * g.row() + i)] += 5.0f;  // the sibling
  }
  EXPECT_EQ(first, second);
}

}  // namespace
}  // namespace servetune::cpu
