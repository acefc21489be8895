// The CPU backend's mixture-of-experts and latent-attention (MLA) ops: expert output scatter, per-head matmuls, and
// attention over a cache of shared latent rows.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/latent_attention_impl.h"
#include "core/error.h"
#include "core/quant.h"

namespace servetune::cpu {

void CpuBackend::scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n, int64_t width,
                                  float* dst) {
  // Split by columns, so every thread adds the rows in the same order: repeated destination rows sum identically
  // whatever the thread count.
  pool_.parallel_for(width, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      const float w = weights[i];
      const float* s = src + i * width;
      float* d = dst + static_cast<int64_t>(rows[i]) * width;
      for (int64_t c = c0; c < c1; ++c) d[c] += w * s[c];
    }
  });
}

void CpuBackend::expert_mlps(std::span<const ExpertMlp> experts, const float* x, float* y) {
  // An expert with many tokens runs alone with every thread in its matmuls; the others run side by side, one thread
  // each (the matmuls' own parallel loops run inline inside a pool task), which is what decode steps have: a few
  // tokens on each of many experts, too little work for one matmul to share.
  const int64_t threads = pool_.size();
  const auto run_one = [&](const ExpertMlp& e, std::vector<float>& gate, std::vector<float>& up) {
    const int64_t width = e.gate->rows, cols = e.gate->cols;
    gate.resize(static_cast<size_t>(e.count * width));
    up.resize(static_cast<size_t>(e.count * width));
    const MatmulOut gate_and_up[] = {{e.gate, nullptr, gate.data()}, {e.up, nullptr, up.data()}};
    matmuls(gate_and_up, x + e.first * cols, e.count);
    silu_mul(gate.data(), up.data(), width, e.count, width, gate.data());
    matmul(*e.down, nullptr, gate.data(), e.count, y + e.first * e.down->rows);
  };
  std::vector<const ExpertMlp*> small;
  std::vector<float> gate, up;
  for (const ExpertMlp& e : experts) {
    if (e.count >= 16 * threads) run_one(e, gate, up);
    else if (e.count > 0) small.push_back(&e);
  }
  pool_.parallel_for(static_cast<int64_t>(small.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> g, u;
    for (int64_t i = begin; i < end; ++i) run_one(*small[static_cast<size_t>(i)], g, u);
  });
}

void CpuBackend::head_matmul(const WeightMatrix& w, int64_t n_heads, const float* x, HeadStrides x_strides, int64_t n,
                             float* y, HeadStrides y_strides) {
  if (n_heads <= 0 || w.rows % n_heads != 0) throw Error(ErrorKind::kInternal, "head_matmul: rows not a multiple of heads");
  const int64_t rows = w.rows / n_heads, cols = w.cols;
  std::vector<float> xs(static_cast<size_t>(n * cols)), ys(static_cast<size_t>(n * rows));
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(xs.data() + t * cols, x + t * x_strides.row + h * x_strides.head, static_cast<size_t>(cols) * sizeof(float));
    }
    const WeightMatrix wh{static_cast<const uint8_t*>(w.data) + h * rows * w.row_bytes, w.type, rows, cols, w.row_bytes};
    matmul(wh, nullptr, xs.data(), n, ys.data());
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(y + t * y_strides.row + h * y_strides.head, ys.data() + t * rows, static_cast<size_t>(rows) * sizeof(float));
    }
  }
}

namespace {

void check_latent_view(const KvLayerView& kv) {
  if (kv.n_kv_heads != 1 || kv.k == nullptr) throw Error(ErrorKind::kInternal, "latent cache view needs one head");
  if (kv.dtype != DType::kF32 && kv.dtype != DType::kF16 && kv.dtype != DType::kFP8_E4M3) {
    throw_unsupported("kv_cache_dtype " + std::string(dtype_name(kv.dtype)) + " for a latent (MLA) cache on the cpu backend");
  }
}

}  // namespace

void CpuBackend::copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t n,
                           int64_t width) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * dst_stride, src + i * src_stride, static_cast<size_t>(width) * sizeof(float));
  }
}

void CpuBackend::store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width, const float* rope_key,
                              const int32_t* slots, int64_t n) {
  check_latent_view(kv);
  const int64_t width = kv.head_dim, rope_width = width - latent_width, capacity = kv.num_blocks * kv.page_size;
  const int64_t row_bytes = width * dtype_info(kv.dtype).type_size;
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t t = 0; t < n; ++t) {
    if (slots[t] < 0 || slots[t] >= capacity) throw Error(ErrorKind::kInternal, "KV slot out of range");
    std::copy_n(latent + t * latent_width, latent_width, row.begin());
    std::copy_n(rope_key + t * rope_width, rope_width, row.begin() + latent_width);
    quantize_row(kv.dtype, row.data(), static_cast<uint8_t*>(kv.k) + slots[t] * row_bytes, width);
  }
}

namespace detail {

void latent_attention_reference(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                                LatentAttentionScratch& scratch) {
  latent_attention_body(item, t0, t1, h0, h1, scratch);
}

}  // namespace detail

void CpuBackend::attention_latent(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                                  int64_t v_dim, float scale, float* out) {
  check_latent_view(kv);
  if (v_dim > kv.head_dim) throw Error(ErrorKind::kInternal, "attention_latent: v_dim above the row width");
  const LatentAttentionKernel kernel = for_selected_isa<LatentAttentionKernel>(
      &detail::latent_attention_avx512, &detail::latent_attention_avx2, &detail::latent_attention_reference);
  const LatentPartialKernel partial = for_selected_isa<LatentPartialKernel>(
      &detail::latent_partial_avx512, &detail::latent_partial_avx2, nullptr);  // the reference runs whole contexts
  const LatentAttentionItem item{&kv, &batch, q, n_heads, v_dim, scale, out};
  // Work items are (token run, head range, position block). A run is up to kRun consecutive tokens of one sequence (a
  // prefill chunk's), which read each cached row once between them; a decode token is a run of its own. A run seeing
  // more than one block of positions is split by block (partials merged after), and runs are split by heads when
  // there are still fewer items than threads (a decode step of one short sequence).
  constexpr int64_t kRun = 8;
  const int64_t n = batch.n_tokens, threads = pool_.size();
  struct Run {
    int64_t t0, t1, blocks;
    size_t partials;  // offset of its first partial in `partials` (split runs)
  };
  std::vector<Run> runs;
  int64_t run_blocks = 0;
  for (int64_t t = 0; t < n;) {
    int64_t end = t + 1;
    // A draft-tree token sees its own ancestors, not the tokens before it: a run of its own.
    while (end < n && end - t < kRun && batch.seq_of_token[end] == batch.seq_of_token[t] &&
           batch.positions[end] == batch.positions[end - 1] + 1 && !attention_tree_token(batch, t) &&
           !attention_tree_token(batch, end)) {
      ++end;
    }
    const int64_t span = attention_span(batch, end - 1);
    const int64_t blocks = partial != nullptr ? (span + kLatentPositionBlock - 1) / kLatentPositionBlock : 1;
    runs.push_back({t, end, blocks, 0});
    run_blocks += blocks;
    t = end;
  }
  const int64_t head_groups = run_blocks >= threads ? 1 : std::min<int64_t>(n_heads, (threads + run_blocks - 1) / run_blocks);
  const auto heads_of = [&](int64_t g) { return std::pair<int64_t, int64_t>{n_heads * g / head_groups, n_heads * (g + 1) / head_groups}; };
  // Partials of the split runs: per run, head group and block, its lanes' header and sums.
  size_t partial_floats = 0;
  std::vector<std::array<int64_t, 3>> items;  // run, head group, block (-1: the whole run, written to out)
  for (size_t r = 0; r < runs.size(); ++r) {
    Run& run = runs[r];
    run.partials = partial_floats;
    for (int64_t g = 0; g < head_groups; ++g) {
      if (run.blocks == 1) {
        items.push_back({static_cast<int64_t>(r), g, -1});
        continue;
      }
      for (int64_t b = 0; b < run.blocks; ++b) items.push_back({static_cast<int64_t>(r), g, b});
    }
    if (run.blocks > 1) partial_floats += static_cast<size_t>(run.blocks * (run.t1 - run.t0) * n_heads * (kLatentPartialHeader + v_dim));
  }
  std::vector<float> partials(partial_floats);
  // Where run r's head group g's block b partial starts: the run's blocks for group g are consecutive, groups in order.
  const auto partial_at = [&](const Run& run, int64_t g, int64_t b) {
    const auto [h0, h1] = heads_of(g);
    const int64_t tokens = run.t1 - run.t0, lane_floats = kLatentPartialHeader + v_dim;
    return partials.data() + run.partials + static_cast<size_t>((run.blocks * tokens * h0 + b * tokens * (h1 - h0)) * lane_floats);
  };
  // Items go round-robin to the threads: a prefill's later runs see more positions, so contiguous ranges would leave
  // the first thread idle while the last one works through the long contexts.
  const auto n_items = static_cast<int64_t>(items.size());
  pool_.run([&](int index, int n_threads) {
    LatentAttentionScratch scratch;
    for (int64_t i = index; i < n_items; i += n_threads) {
      const auto [r, g, b] = items[static_cast<size_t>(i)];
      const Run& run = runs[static_cast<size_t>(r)];
      const auto [h0, h1] = heads_of(g);
      if (b < 0) kernel(item, run.t0, run.t1, h0, h1, scratch);
      else partial(item, run.t0, run.t1, h0, h1, b, partial_at(run, g, b), scratch);
    }
  });
  if (partial_floats == 0) return;
  pool_.run([&](int index, int n_threads) {
    int64_t k = 0;
    for (const Run& run : runs) {
      if (run.blocks == 1) continue;
      for (int64_t g = 0; g < head_groups; ++g, ++k) {
        if (k % n_threads != index) continue;
        const auto [h0, h1] = heads_of(g);
        detail::latent_merge(item, run.t0, run.t1, h0, h1, partial_at(run, g, 0), run.blocks);
      }
    }
  });
}

namespace detail {

void latent_merge(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1, const float* partials,
                  int64_t blocks) {
  const int64_t hn = h1 - h0, lanes = (t1 - t0) * hn, lane_floats = kLatentPartialHeader + item.v_dim;
  const int64_t block_floats = lanes * lane_floats;
  std::vector<float> acc(static_cast<size_t>(item.v_dim));
  for (int64_t lane = 0; lane < lanes; ++lane) {
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t b = 0; b < blocks; ++b) max = std::max(max, partials[b * block_floats + lane * lane_floats]);
    // Each block's sums rescaled from its own max to the overall one, added in block order.
    float sum = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* part = partials + b * block_floats + lane * lane_floats;
      const float factor = std::exp((part[0] - max) * item.scale);  // 0 for a block the lane does not see
      sum += part[1] * factor;
      for (int64_t c = 0; c < item.v_dim; ++c) acc[static_cast<size_t>(c)] += part[kLatentPartialHeader + c] * factor;
    }
    const float inv = 1.0f / sum;
    float* o = item.out + ((t0 + lane / hn) * item.n_heads + h0 + lane % hn) * item.v_dim;
    for (int64_t c = 0; c < item.v_dim; ++c) o[c] = acc[static_cast<size_t>(c)] * inv;
  }
}

}  // namespace detail

}  // namespace servetune::cpu
