// The CPU attention kernel for a range of one token's query heads, written once over a vector-ISA traits type (S):
// included only by the per-ISA translation units (attention_avx512.cpp, attention_avx2.cpp), compiled with that ISA.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/attention_simd.h"
#include "backend/cpu/kv_layout.h"
#include "core/half.h"

namespace servetune::cpu::detail::attention_impl {

// Walks a sequence's positions 0, 1, 2, ... as cache slots through its block table, without dividing.
struct SlotWalker {
  const int32_t* table;
  int64_t page;
  int64_t block = 0, within = 0;
  int64_t next() {
    const int64_t slot = static_cast<int64_t>(table[block]) * page + within;
    if (++within == page) within = 0, ++block;
    return slot;
  }
};

// A head's stretch of each V row is scattered over blocks, which the hardware prefetcher does not follow: this
// walker runs `distance` positions ahead of the one reading and prefetches the stretches it passes.
struct RowPrefetcher {
  SlotWalker walker;
  const char* base;
  int64_t row_bytes, span_bytes, remaining;
  RowPrefetcher(const int32_t* table, int64_t page, const void* base_, int64_t row_bytes_, int64_t span_bytes_,
                int64_t n_ctx, int64_t distance)
      : walker{table, page},
        base(static_cast<const char*>(base_)),
        row_bytes(row_bytes_),
        span_bytes(span_bytes_),
        remaining(n_ctx) {
    for (int64_t i = 0; i < distance && remaining > 0; ++i) fetch();
  }
  void fetch() {
    if (remaining == 0) return;
    --remaining;
    const char* row = base + walker.next() * row_bytes;
    for (int64_t b = 0; b < span_bytes; b += 64) __builtin_prefetch(row + b, 0, 3);
  }
};

// KV elements as the kernels read them: f32 and f16 exactly; FP8 E4M3 exactly times 2^-8 (kLoadUnit folds the 2^8
// back into the score scale and the weighted sums; a power of two, so the results round as if it were not there).
template <class KvT>
constexpr float kLoadUnit = std::is_same_v<KvT, uint8_t> ? 256.0f : 1.0f;

// The NV vectors of one head's stretch of a K or V row.
template <class S, int NV, class KvT>
[[gnu::always_inline]] inline void load_kv_row(const KvT* p, typename S::V* out) {
  if constexpr (std::is_same_v<KvT, uint8_t>) {
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) out[i] = S::load_fp8_scaled(p + i * S::kWidth);
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) out[i] = S::load(p + i * S::kWidth);
  }
}

// Positions a prefetcher runs ahead: about 4 KB of rows, between one and two key blocks.
template <int W>
int64_t prefetch_distance(int64_t span_bytes) {
  return std::clamp<int64_t>(4096 / span_bytes, W, 2 * W);
}

// Scores of one block of W keys (vector lanes) for the G query heads of one KV head: `cols` points at the block's
// dimension 0 and each next dimension is `dim_stride` elements on (K is transposed within pages, kv_layout.h).
// scores[g * stride + j0 + i] = q_g . k_i * scale for the heads' q rows q + g * head_dim; each head's sum runs as
// two chains (even and odd dimensions) whatever G is. Lanes past the keys in use hold whatever the page holds there.
// `ahead`: the same dimensions of a later block, prefetched into L2 a line per dimension (null: none).
template <class S, int NV, class KvT, int G>
[[gnu::always_inline]] inline void score_keys(const KvT* cols, int64_t dim_stride, const KvT* ahead, const float* q,
                                              int64_t stride, int64_t j0, float scale, float* scores) {
  using V = typename S::V;
  constexpr int W = S::kWidth;
  constexpr int kHd = NV * W;
  V even[G], odd[G];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) even[g] = odd[g] = S::zero();
  for (int d = 0; d < kHd; d += 2) {
    if (ahead != nullptr) {
      __builtin_prefetch(ahead + d * dim_stride, 0, 1);
      __builtin_prefetch(ahead + (d + 1) * dim_stride, 0, 1);
    }
    V k0, k1;
    load_kv_row<S, 1>(cols + d * dim_stride, &k0);
    load_kv_row<S, 1>(cols + (d + 1) * dim_stride, &k1);
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      even[g] = S::fmadd(S::set1(q[g * kHd + d]), k0, even[g]);
      odd[g] = S::fmadd(S::set1(q[g * kHd + d + 1]), k1, odd[g]);
    }
  }
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) S::store(scores + g * stride + j0, S::mul(S::add(even[g], odd[g]), S::set1(scale)));
}

// outs[g][c] = sum_j p[g, j] * V row j's column c, for the NV vectors' worth of columns c that kv.v starts at and
// the G query rows of a pass, p[g, j] = probs[g * stride + j].
template <class S, int NV, class KvT, int G>
void value_pass(const KvLayerView& kv, const int32_t* table, int64_t n_ctx, const float* probs, int64_t stride,
                float* const* outs) {
  using V = typename S::V;
  constexpr int W = S::kWidth;
  const int64_t width = kv.n_kv_heads * kv.head_dim;
  const KvT* v_base = static_cast<const KvT*>(kv.v);
  V acc[G * NV];
#pragma GCC unroll 64
  for (int i = 0; i < G * NV; ++i) acc[i] = S::zero();
  SlotWalker values{table, kv.page_size};
  constexpr int64_t kSliceBytes = int64_t{NV} * W * sizeof(KvT);
  RowPrefetcher value_ahead(table, kv.page_size, v_base, width * sizeof(KvT), kSliceBytes, n_ctx,
                            prefetch_distance<W>(kSliceBytes));
  for (int64_t j = 0; j < n_ctx; ++j) {
    const KvT* v = v_base + values.next() * width;
    value_ahead.fetch();
    V row[NV];  // loaded (and widened) once for all heads of the pass
    load_kv_row<S, NV>(v, row);
    // Unrolled from the start, so acc[] is only ever indexed by constants and stays in registers.
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      const V w = S::set1(probs[g * stride + j]);
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) acc[g * NV + i] = S::fmadd(w, row[i], acc[g * NV + i]);
    }
  }
  const V unit = S::set1(kLoadUnit<KvT>);
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) {
      S::store(outs[g] + i * W, kLoadUnit<KvT> == 1.0f ? acc[g * NV + i] : S::mul(acc[g * NV + i], unit));
    }
  }
}

// How the weighted sums of a head of NV vectors split into passes: when at least two whole heads' accumulators fit
// in registers, a pass takes whole heads; otherwise (AVX2 at head_dim 64) a pass takes a slice of the columns of up to
// kAccRegs / slice heads, so each V row is loaded and widened once per slice rather than once per head. Each output
// element's sum runs over the same positions in the same order either way.
template <class S, int NV>
struct ValuePasses {
  static constexpr bool kWholeHeads = S::kAccRegs / NV >= 2;
  static constexpr int kSliceVectors = [] {
    if (kWholeHeads) return NV;
    int v = std::max(1, S::kAccRegs / 4);
    while (NV % v != 0) --v;
    return v;
  }();
  static constexpr int kHeadsPerPass = S::kAccRegs / kSliceVectors;
};

// The tokens of a task: consecutive tokens of one sequence (they share its block table), each with the positions
// its attention scans and, for a draft-tree token, its mask. Their q and out rows are `row_floats` apart.
struct TokenRun {
  int64_t count = 0;
  int64_t row_floats = 0;
  int64_t span = 0;  // the most positions any of them scans
  int64_t n_ctx[kMaxRunTokens];
  int64_t tree_base[kMaxRunTokens];
  uint64_t tree_mask[kMaxRunTokens];
};

// Heads [head_begin, head_begin + head_count) of the run's tokens, whose KV heads are kv_first, kv_first + 1, ...:
// the task reads each of those KV heads' K columns (keys as lanes) and the stretch of each V row that holds their
// columns once for all its heads and tokens. Score rows go KV head by KV head, within one token by token, within
// one head by head, so the rows sharing a KV head are consecutive for the value passes.
template <class S, int NV, class KvT>
void heads(const KvLayerView& kv, const int32_t* table, const TokenRun& run, const float* q, int64_t head_begin,
           int64_t head_count, int64_t group_size, float scale, float* scores, float* out) {
  using V = typename S::V;
  constexpr int W = S::kWidth;
  constexpr int64_t kHd = int64_t{NV} * W;
  const int64_t n_ctx = run.span, tokens = run.count;
  const int64_t width = kv.n_kv_heads * kHd;
  const int64_t stride = (n_ctx + W - 1) / W * W;
  const int64_t head_end = head_begin + head_count;
  const int64_t kv_first = head_begin / group_size, kv_end = (head_end - 1) / group_size + 1;
  const int64_t span_bytes = (kv_end - kv_first) * kHd * static_cast<int64_t>(sizeof(KvT));
  const KvT* v_base = static_cast<const KvT*>(kv.v) + kv_first * kHd;
  // The heads of KV head kh within the task, as offsets from head_begin.
  auto heads_of = [&](int64_t kh) {
    return std::pair<int64_t, int64_t>{std::max(head_begin, kh * group_size) - head_begin,
                                       std::min(head_end, (kh + 1) * group_size) - head_begin};
  };
  // The score row of token i's head h (an offset from head_begin) of KV head kh.
  auto row_of = [&](int64_t kh, int64_t i, int64_t h) {
    const auto [h0, h1] = heads_of(kh);
    return tokens * h0 + i * (h1 - h0) + (h - h0);
  };
  // V rows `distance` positions ahead are prefetched one KV head's stretch at a time, between the key blocks in use
  // (bursts of whole-row prefetches stall on the core's miss buffers; spread out they do not), into L2, not L1: a
  // DRAM line prefetched into L1 holds one of the core's few L1 miss buffers for the whole trip, which caps one
  // core's bandwidth, while L2 keeps several times as many misses outstanding. V goes early so
  // the weighted sum does not start cold on DRAM, but only while the task's V stretches stay cached meanwhile (long
  // contexts rely on the value loop's own prefetch). K columns are prefetched inside score_keys, two blocks ahead.
  const bool values_early = n_ctx * span_bytes <= 256 * 1024;
  const auto prefetch_values = [&](int64_t slot, int64_t offset, int64_t bytes) {
    const char* v_row = reinterpret_cast<const char*>(v_base + slot * width + offset);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(v_row + b, 0, 1);
  };
  SlotWalker ahead{table, kv.page_size};
  int64_t ahead_left = values_early ? n_ctx : 0;
  for (int64_t i = prefetch_distance<W>(span_bytes); i > 0 && ahead_left > 0; --i, --ahead_left) {
    prefetch_values(ahead.next(), 0, span_bytes);
  }

  // Scores: W keys at a time as the lanes of a vector. A block lies in one page when pages hold whole blocks;
  // otherwise its columns are gathered key by key first.
  const KvT* k_all = static_cast<const KvT*>(kv.k);
  const int64_t page = kv.page_size;
  const bool whole_blocks = page % W == 0;
  alignas(64) KvT gathered[kHd * W];
  SlotWalker keys{table, page};
  const float row_scale = scale * kLoadUnit<KvT>;
  for (int64_t j0 = 0; j0 < n_ctx; j0 += W) {
    const int m = static_cast<int>(std::min<int64_t>(W, n_ctx - j0));
    int64_t slots[W];
    for (int i = 0; i < m; ++i) slots[i] = keys.next();
    int64_t ahead_slots[W];
    for (int i = 0; i < m; ++i) ahead_slots[i] = ahead_left > 0 ? (--ahead_left, ahead.next()) : -1;
    const int64_t j_ahead = j0 + 2 * W;  // the key block prefetched while this one is scored (whole blocks only)
    const int64_t slot_ahead =
        whole_blocks && j_ahead < n_ctx ? static_cast<int64_t>(table[j_ahead / page]) * page + j_ahead % page : -1;
    for (int64_t kh = kv_first; kh < kv_end; ++kh) {
      const auto [h0, h1] = heads_of(kh);
      for (int i = 0; i < m; ++i) {
        if (ahead_slots[i] < 0) continue;
        prefetch_values(ahead_slots[i], (kh - kv_first) * kHd, kHd * static_cast<int64_t>(sizeof(KvT)));
      }
      const KvT* cols = gathered;
      int64_t dim_stride = W;
      const KvT* ahead_cols = nullptr;
      if (whole_blocks) {
        cols = k_all + k_cache_index(kv, slots[0], kh, 0);
        dim_stride = page;
        if (slot_ahead >= 0) ahead_cols = k_all + k_cache_index(kv, slot_ahead, kh, 0);
      } else {
        for (int i = 0; i < W; ++i) {
          const KvT* key = i < m ? k_all + k_cache_index(kv, slots[i], kh, 0) : nullptr;  // dimension d at d * page
          for (int64_t d = 0; d < kHd; ++d) gathered[d * W + i] = key != nullptr ? key[d * page] : KvT{};
        }
      }
      // Each token's heads of this KV head, up to four at a time (each head's sums do not depend on its company;
      // the block's K columns, loaded for the first, stay in L1 for the rest). A token that sees none of the block
      // skips it: the softmax sets its scores there to -inf.
      for (int64_t i = 0; i < tokens; ++i) {
        if (j0 >= run.n_ctx[i]) continue;
        for (int64_t g0 = h0; g0 < h1; g0 += 4) {
          const int gc = static_cast<int>(std::min<int64_t>(4, h1 - g0));
          const float* qg = q + i * run.row_floats + g0 * kHd;
          float* sg = scores + row_of(kh, i, g0) * stride;
          [&]<int... Gs>(std::integer_sequence<int, Gs...>) {
            ((gc == Gs + 1 &&
              (score_keys<S, NV, KvT, Gs + 1>(cols, dim_stride, ahead_cols, qg, stride, j0, row_scale, sg), true)) ||
             ...);
          }(std::make_integer_sequence<int, 4>{});
        }
      }
    }
  }

  // Softmax per score row, in place (past the row's token's n_ctx the scores are -inf, so their exp is 0; so are a
  // draft tree's other branches, tree_mask != 0: their weights are exactly 0, as if the token's scan had skipped
  // them; the value passes then add those rows' zero weights, which changes no bits).
  for (int64_t kh = kv_first; kh < kv_end; ++kh) {
    const auto [h0, h1] = heads_of(kh);
    for (int64_t i = 0; i < tokens; ++i) {
      const int64_t token_ctx = run.n_ctx[i], tree_base = run.tree_base[i];
      const uint64_t tree_mask = run.tree_mask[i];
      for (int64_t g = h0; g < h1; ++g) {
        float* s = scores + row_of(kh, i, g) * stride;
        for (int64_t j = token_ctx; j < stride; ++j) s[j] = -INFINITY;
        if (tree_mask != 0) {
          for (int64_t j = tree_base; j < token_ctx; ++j) {
            if (((tree_mask >> (j - tree_base)) & 1u) == 0) s[j] = -INFINITY;
          }
        }
        V mx = S::set1(-INFINITY);
        for (int64_t j = 0; j < stride; j += W) mx = S::max(mx, S::load(s + j));
        const V shift = S::set1(S::hmax(mx));
        V sum = S::zero();
        for (int64_t j = 0; j < stride; j += W) {
          const V e = S::exp(S::sub(S::load(s + j), shift));
          S::store(s + j, e);
          sum = S::add(sum, e);
        }
        if (tree_mask != 0) {
          // A draft-tree token sums its weights in the lanes a causal scan of its path alone gives them (the
          // context, then its ancestors packed), so its output is bit for bit that scan's and an accepted path's
          // K/V is exactly what plain decoding computes.
          thread_local std::vector<float> packed;
          packed.assign(static_cast<size_t>(stride), 0.0f);
          int64_t seen = 0;
          for (int64_t j = 0; j < token_ctx; ++j) {
            if (j < tree_base || ((tree_mask >> (j - tree_base)) & 1u) != 0) packed[static_cast<size_t>(seen++)] = s[j];
          }
          sum = S::zero();
          for (int64_t j = 0; j < stride; j += W) sum = S::add(sum, S::load(packed.data() + j));
        }
        const V inv = S::set1(1.0f / S::hsum(sum));
        for (int64_t j = 0; j < stride; j += W) S::store(s + j, S::mul(S::load(s + j), inv));
      }
    }
  }

  // Weighted sum of values, per KV head and column slice, for as many of its score rows (heads and tokens) at a
  // time as the accumulators fit in registers (the row count of a pass is a template argument, so the accumulators
  // stay in registers).
  using Passes = ValuePasses<S, NV>;
  constexpr int kSlice = Passes::kSliceVectors;
  constexpr int kRowsPerPass = Passes::kHeadsPerPass;
  for (int64_t kh = kv_first; kh < kv_end; ++kh) {
    const auto [h0, h1] = heads_of(kh);
    const int64_t kh_heads = h1 - h0, kh_rows = tokens * kh_heads;
    for (int64_t c0 = 0; c0 < kHd; c0 += int64_t{kSlice} * W) {
      KvLayerView slice_kv = kv;  // V at this KV head's columns c0...; rows stay n_kv_heads * hd apart
      slice_kv.v = const_cast<KvT*>(v_base + (kh - kv_first) * kHd + c0);
      for (int64_t r0 = 0; r0 < kh_rows; r0 += kRowsPerPass) {
        const int gc = static_cast<int>(std::min<int64_t>(kRowsPerPass, kh_rows - r0));
        const float* probs = scores + (tokens * h0 + r0) * stride;
        float* outs[kRowsPerPass];
        for (int r = 0; r < gc; ++r) {
          const int64_t i = (r0 + r) / kh_heads, h = h0 + (r0 + r) % kh_heads;
          outs[r] = out + i * run.row_floats + h * kHd + c0;
        }
        [&]<int... Gs>(std::integer_sequence<int, Gs...>) {
          ((gc == Gs + 1 &&
            (value_pass<S, kSlice, KvT, Gs + 1>(slice_kv, table, n_ctx, probs, stride, outs), true)) ||
           ...);
        }
        (std::make_integer_sequence<int, kRowsPerPass>{});
      }
    }
  }
}

template <class S, class KvT>
void attention_group_typed(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                           float scale, int64_t t0, int64_t t1, int64_t head_begin, int64_t head_count, float* scratch,
                           float* out) {
  const int64_t hd = kv.head_dim;
  const int64_t group_size = n_heads / kv.n_kv_heads;
  TokenRun run;
  run.count = t1 - t0;
  run.row_floats = n_heads * hd;
  for (int64_t i = 0; i < run.count; ++i) {
    const int64_t t = t0 + i;
    const bool tree = attention_tree_token(batch, t);
    run.n_ctx[i] = attention_span(batch, t);
    run.tree_base[i] = tree ? batch.tree_base[t] : 0;
    run.tree_mask[i] = tree ? batch.tree_mask[t] : 0;
    run.span = std::max(run.span, run.n_ctx[i]);
  }
  const int32_t* table = batch.block_tables + batch.seq_of_token[t0] * batch.max_blocks_per_seq;
  const float* qh = q + (t0 * n_heads + head_begin) * hd;
  float* oh = out + (t0 * n_heads + head_begin) * hd;
  switch (hd / S::kWidth) {
    case 1: heads<S, 1, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    case 2: heads<S, 2, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    case 3: heads<S, 3, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    case 4: heads<S, 4, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    case 5: heads<S, 5, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    case 6: heads<S, 6, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    case 7: heads<S, 7, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    case 8: heads<S, 8, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    case 16: heads<S, 16, KvT>(kv, table, run, qh, head_begin, head_count, group_size, scale, scratch, oh); break;
    default: break;  // excluded by attention_simd_supports
  }
}

// KV rows of f32, or of f16, bf16 or FP8 E4M3 (as ref::store_kv_row writes them) widened on load.
template <class S>
void attention_group(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                     int64_t t0, int64_t t1, int64_t head_begin, int64_t head_count, float* scratch, float* out) {
  if (kv.dtype == DType::kF16) {
    attention_group_typed<S, uint16_t>(kv, batch, q, n_heads, scale, t0, t1, head_begin, head_count, scratch, out);
  } else if (kv.dtype == DType::kBF16) {
    attention_group_typed<S, Bf16Bits>(kv, batch, q, n_heads, scale, t0, t1, head_begin, head_count, scratch, out);
  } else if (kv.dtype == DType::kFP8_E4M3) {
    attention_group_typed<S, uint8_t>(kv, batch, q, n_heads, scale, t0, t1, head_begin, head_count, scratch, out);
  } else {
    attention_group_typed<S, float>(kv, batch, q, n_heads, scale, t0, t1, head_begin, head_count, scratch, out);
  }
}

}  // namespace servetune::cpu::detail::attention_impl
