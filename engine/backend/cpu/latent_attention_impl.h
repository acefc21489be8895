// The latent attention kernels: the scalar reference (one dot product per token, head and position) and the SIMD
// body over an ISA's vector traits (simd_avx2.h / simd_avx512.h), included by one file per ISA. Internal linkage:
// safe in any ISA's file.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <span>
#include <vector>

#include "backend/cpu/latent_attention.h"
#include "backend/cpu/vector_math.h"
#include "core/quant.h"

namespace servetune::cpu {
namespace {

constexpr int kLatentLanes = 16;

// a . b with element i in lane i % 16 (whole lane groups first, the tail on its own), lanes added pairwise.
inline float lane_dot(const float* a, const float* b, int64_t n) {
  float lane[kLatentLanes] = {};
  int64_t c = 0;
  for (; c + kLatentLanes <= n; c += kLatentLanes) {
    for (int j = 0; j < kLatentLanes; ++j) lane[j] += a[c + j] * b[c + j];
  }
  float tail = 0.0f;
  for (; c < n; ++c) tail += a[c] * b[c];
  for (int half = kLatentLanes / 2; half >= 1; half /= 2) {
    for (int j = 0; j < half; ++j) lane[j] += lane[j + half];
  }
  return lane[0] + tail;
}

// The rows of token t's sequence, widened to f32 into `buf` when the cache holds a narrower type.
struct CachedRows {
  const KvLayerView& kv;
  const int32_t* table;
  int64_t row_bytes;
  // The row of position p as the cache stores it.
  const uint8_t* stored(int64_t p) const {
    const int64_t slot = static_cast<int64_t>(table[p / kv.page_size]) * kv.page_size + p % kv.page_size;
    return static_cast<const uint8_t*>(kv.k) + slot * row_bytes;
  }
  const float* get(int64_t p, std::vector<float>& buf) const {
    const uint8_t* stored = this->stored(p);
    if (kv.dtype == DType::kF32) return reinterpret_cast<const float*>(stored);
    dequantize_row(kv.dtype, stored, buf.data(), kv.head_dim);
    return buf.data();
  }
};

// The reference. Tokens [t0, t1) of one sequence at consecutive positions (a prefill chunk's run, or one decode token),
// heads [h0, h1): three passes over the positions: every (token, head)'s scores (each cached row read once for all of them,
// since the heads share it and every later token sees it too), the softmax weights by the vector exp, then the
// weighted sum of the rows' first v_dim values.
inline void latent_attention_body(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                                  LatentAttentionScratch& s) {
  const KvLayerView& kv = *item.kv;
  const AttentionBatch& batch = *item.batch;
  const int64_t width = kv.head_dim, v_dim = item.v_dim, hn = h1 - h0;
  const int64_t span = attention_span(batch, t1 - 1);  // positions any of the tokens sees; scores' row stride
  const bool tree = attention_tree_token(batch, t0);  // a draft-tree token: a run of its own, masked below
  const int64_t first = tree ? span - 1 : batch.positions[t0];
  const int64_t lanes = (t1 - t0) * hn;                // (token, head) pairs, token-major
  const CachedRows rows{kv, batch.block_tables + batch.seq_of_token[t0] * batch.max_blocks_per_seq,
                        width * dtype_info(kv.dtype).type_size};
  s.row.resize(static_cast<size_t>(width));
  s.scores.resize(static_cast<size_t>(lanes * span));
  s.acc.assign(static_cast<size_t>(lanes * v_dim), 0.0f);
  s.sum.resize(static_cast<size_t>(lanes));
  // Token t0 + j sees positions [0, first + j]: a row at position p serves the tokens from j = p - first on.
  const auto first_token = [&](int64_t p) { return std::max<int64_t>(0, p - first); };
  for (int64_t p = 0; p < span; ++p) {
    const float* r = rows.get(p, s.row);
    for (int64_t j = first_token(p); j < t1 - t0; ++j) {
      const float* qt = item.q + ((t0 + j) * item.n_heads + h0) * width;
      float* scores = s.scores.data() + j * hn * span + p;
      const bool seen = !tree || attention_sees(batch, t0, p);
      for (int64_t h = 0; h < hn; ++h) scores[h * span] = seen ? lane_dot(qt + h * width, r, width) : -INFINITY;
    }
  }
  std::vector<float> packed;
  for (int64_t lane = 0; lane < lanes; ++lane) {
    const std::span<float> seen(s.scores.data() + lane * span, static_cast<size_t>(first + lane / hn + 1));
    const float max = max_value(seen);
    if (tree) {  // the sum over the visible scores packed, as a causal run of the token's path alone lays them out
      packed.clear();
      for (int64_t p = 0; p < span; ++p) {
        if (attention_sees(batch, t0, p)) packed.push_back(seen[static_cast<size_t>(p)]);
      }
      s.sum[static_cast<size_t>(lane)] = static_cast<float>(exp_scaled(packed, max, item.scale, packed));
      size_t next = 0;  // the weights back in place, 0 where unseen
      for (int64_t p = 0; p < span; ++p) seen[static_cast<size_t>(p)] = attention_sees(batch, t0, p) ? packed[next++] : 0.0f;
      continue;
    }
    s.sum[static_cast<size_t>(lane)] = static_cast<float>(exp_scaled(seen, max, item.scale, seen));
  }
  for (int64_t p = 0; p < span; ++p) {
    const float* r = rows.get(p, s.row);
    for (int64_t lane = first_token(p) * hn; lane < lanes; ++lane) {
      const float w = s.scores[static_cast<size_t>(lane * span + p)];
      float* a = s.acc.data() + lane * v_dim;
      for (int64_t c = 0; c < v_dim; ++c) a[c] += w * r[c];
    }
  }
  for (int64_t lane = 0; lane < lanes; ++lane) {
    const float inv = 1.0f / s.sum[static_cast<size_t>(lane)];
    const int64_t t = t0 + lane / hn, h = h0 + lane % hn;
    float* o = item.out + (t * item.n_heads + h) * v_dim;
    const float* a = s.acc.data() + lane * v_dim;
    for (int64_t c = 0; c < v_dim; ++c) o[c] = a[c] * inv;
  }
}


// The SIMD kernel, with the reference's contract. Every head of every token scores the same cached rows, so the
// (token, head) pairs are the vector lanes (FlashMLA's view: the heads are a GEMM's rows): a row's value at column c is
// broadcast against the lanes' queries at c, with no horizontal sums. A lane's arithmetic does not depend on which
// lanes share its vector: each score is a chain of fused multiply-adds over the row in order, the softmax runs over
// the positions the lane's token sees in order, and each output is a chain over those positions. Prefill runs and
// decode tokens therefore give a token the same bits. Positions are taken kPositions at a time (independent chains
// for the score pass, one load and store of the output sums per block in the value pass), more of them when fewer
// lane vectors leave registers free: a decode token of 16 heads is one vector.
constexpr int64_t kLatentLaneVectors = 4;  // lane vectors per pass

template <class S>
struct LatentLanes {
  using V = typename S::V;
  static constexpr int64_t kChunk = kLatentLaneVectors * S::kWidth;  // lanes per pass

  const LatentAttentionItem& item;
  const CachedRows& rows;
  LatentAttentionScratch& s;
  int64_t width, v_dim, first;
  int64_t begin, end;  // the positions of this pass: [begin, end)
  int64_t tree_base = 0;   // a draft-tree token's run (AttentionBatch::tree_mask; 0: none): every lane is that token's
  uint64_t tree_mask = 0;

  // Rows [p0, p0 + n) widened to f32 where the cache is narrower (each in its own buffer of the scratch), a vector at
  // a time (f16 and FP8 widen exactly, so the values are dequantize_row's).
  template <int64_t P>
  void load_rows(int64_t p0, int64_t n, const float* (&r)[P]) {
    const KvLayerView& kv = *item.kv;
    for (int64_t i = 0; i < P; ++i) {
      if (i >= n) {
        r[i] = r[0];
        continue;
      }
      const uint8_t* stored = rows.stored(p0 + i);
      if (kv.dtype == DType::kF32) {
        r[i] = reinterpret_cast<const float*>(stored);
        continue;
      }
      std::vector<float>& buf = s.rows[static_cast<size_t>(i)];
      buf.resize(static_cast<size_t>(width));
      int64_t c = 0;
      if (kv.dtype == DType::kF16) {
        for (; c + S::kWidth <= width; c += S::kWidth) S::store(buf.data() + c, S::load(reinterpret_cast<const uint16_t*>(stored) + c));
      } else if (kv.dtype == DType::kFP8_E4M3) {
        const V unscale = S::set1(256.0f);  // load_fp8_scaled gives 2^-8 times each code's value
        for (; c + S::kWidth <= width; c += S::kWidth) S::store(buf.data() + c, S::mul(S::load_fp8_scaled(stored + c), unscale));
      }
      if (c < width) {  // the tail (or another type) as the reference widens it
        const int64_t elem = dtype_info(kv.dtype).type_size;
        dequantize_row(kv.dtype, stored + c * elem, buf.data() + c, width - c);
      }
      r[i] = buf.data();
    }
  }

  // One pass over kChunk lanes in NV vectors (their queries transposed in s.queries, unused lanes 0) and the
  // positions [begin, end): scores, the softmax weights in s.scores [end - begin][kChunk], the unnormalised output
  // sums in s.acc [v_dim][kChunk], and per lane the largest score (-inf where the lane sees none of the positions)
  // and the weights' sum in `max_out` and `sum_out` [kChunk].
  template <int NV>
  void pass(const float* last_seen, float* max_out, float* sum_out) {
    constexpr int64_t P = NV == 1 ? 8 : NV == 2 ? 4 : 2;  // positions per block: P x NV accumulators in registers
    const float* queries = s.queries.data();
    float* scores = s.scores.data();
    const V neg_inf = S::set1(-INFINITY);
    constexpr uint32_t kAllLanes = S::kWidth == 32 ? ~0u : (1u << S::kWidth) - 1u;
    V last[NV], max[NV], sum[NV];
    for (int g = 0; g < NV; ++g) {
      last[g] = S::load(last_seen + g * S::kWidth);
      max[g] = neg_inf;
      sum[g] = S::zero();
    }
    for (int64_t p0 = begin; p0 < end; p0 += P) {
      const int64_t n = std::min(P, end - p0);
      const float* r[P];
      load_rows<P>(p0, n, r);
      V acc[P][NV];
      for (int64_t i = 0; i < P; ++i) {
        for (int g = 0; g < NV; ++g) acc[i][g] = S::zero();
      }
      for (int64_t c = 0; c < width; ++c) {
        V q[NV];
        for (int g = 0; g < NV; ++g) q[g] = S::load(queries + c * kChunk + g * S::kWidth);
        for (int64_t i = 0; i < P; ++i) {
          const V rc = S::set1(r[i][c]);
          for (int g = 0; g < NV; ++g) acc[i][g] = S::fmadd(q[g], rc, acc[i][g]);
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t p = p0 + i;
        for (int g = 0; g < NV; ++g) {
          V a = acc[i][g];
          if (p > first) {  // inside the run: lanes of earlier tokens do not see p
            const uint32_t seen = S::ge_mask(last[g], S::set1(static_cast<float>(p)));
            a = S::add(S::zero_unless(seen, a), S::zero_unless(~seen & kAllLanes, neg_inf));
          }
          if (tree_mask != 0 && p >= tree_base && ((tree_mask >> (p - tree_base)) & 1u) == 0) a = neg_inf;
          S::store(scores + (p - begin) * kChunk + g * S::kWidth, a);
          max[g] = S::max(max[g], a);
        }
      }
    }
    const V scale = S::set1(item.scale);
    V shift[NV];  // the max, or 0 for a lane that sees none of the positions (so its weights are e^-inf = 0, not NaN)
    for (int g = 0; g < NV; ++g) shift[g] = S::zero_unless(S::ge_mask(max[g], S::set1(-FLT_MAX)), max[g]);
    for (int64_t p = 0; p < end - begin; ++p) {  // weights e^((score - max) * scale), 0 where unseen
      for (int g = 0; g < NV; ++g) {
        float* w = scores + p * kChunk + g * S::kWidth;
        const V e = S::exp(S::mul(S::sub(S::load(w), shift[g]), scale));
        S::store(w, e);
        sum[g] = S::add(sum[g], e);
      }
    }
    float* acc = s.acc.data();
    std::fill_n(acc, v_dim * kChunk, 0.0f);
    for (int64_t p0 = begin; p0 < end; p0 += P) {
      const int64_t n = std::min(P, end - p0);
      const float* r[P];
      load_rows<P>(p0, n, r);
      V w[P][NV];
      for (int64_t i = 0; i < P; ++i) {
        for (int g = 0; g < NV; ++g) w[i][g] = i < n ? S::load(scores + (p0 - begin + i) * kChunk + g * S::kWidth) : S::zero();
      }
      for (int64_t c = 0; c < v_dim; ++c) {
        for (int g = 0; g < NV; ++g) {
          float* a = acc + c * kChunk + g * S::kWidth;
          V sum_c = S::load(a);
          for (int64_t i = 0; i < n; ++i) sum_c = S::fmadd(w[i][g], S::set1(r[i][c]), sum_c);  // positions in order
          S::store(a, sum_c);
        }
      }
    }
    for (int g = 0; g < NV; ++g) {
      S::store(max_out + g * S::kWidth, max[g]);
      S::store(sum_out + g * S::kWidth, sum[g]);
    }
  }
};

// Tokens [t0, t1), heads [h0, h1) over the positions [begin, end) (end < 0: all they see). With `partial` null, out
// = the attention output; else partial = the range's part per lane (latent_attention.h: LatentPartialKernel).
template <class S>
void latent_attention_lanes(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                            int64_t begin, int64_t end, float* partial, LatentAttentionScratch& s) {
  using Lanes = LatentLanes<S>;
  constexpr int64_t kChunk = Lanes::kChunk;
  const KvLayerView& kv = *item.kv;
  const AttentionBatch& batch = *item.batch;
  const int64_t width = kv.head_dim, hn = h1 - h0;
  const int64_t span = attention_span(batch, t1 - 1);  // positions any of the tokens sees
  const bool tree = attention_tree_token(batch, t0);  // a draft-tree token: a run of its own
  const int64_t first = tree ? span - 1 : batch.positions[t0];
  if (end < 0 || end > span) end = span;
  const int64_t lanes = (t1 - t0) * hn;  // (token, head) pairs, token-major
  const CachedRows rows{kv, batch.block_tables + batch.seq_of_token[t0] * batch.max_blocks_per_seq,
                        width * dtype_info(kv.dtype).type_size};
  s.rows.resize(8);
  s.queries.resize(static_cast<size_t>(width * kChunk));
  s.scores.resize(static_cast<size_t>(std::max<int64_t>(end - begin, 1) * kChunk));
  s.acc.resize(static_cast<size_t>(item.v_dim * kChunk));
  s.sum.resize(static_cast<size_t>(2 * kChunk));
  Lanes run{item, rows, s, width, item.v_dim, first, begin, end};
  if (tree) {
    run.tree_base = batch.tree_base[t0];
    run.tree_mask = batch.tree_mask[t0];
  }
  for (int64_t l0 = 0; l0 < lanes; l0 += kChunk) {
    const int64_t nl = std::min(kChunk, lanes - l0), nv = (nl + S::kWidth - 1) / S::kWidth;
    // Queries transposed (queries[c * kChunk + i] is lane l0 + i's column c), unused lanes 0; the last position each
    // lane's token sees (unused lanes: all of them).
    float* queries = s.queries.data();
    float last_seen[kChunk];
    for (int64_t i = 0; i < kChunk; ++i) {
      const int64_t lane = l0 + i;
      last_seen[i] = static_cast<float>(i < nl ? first + lane / hn : span);
      const float* q = i < nl ? item.q + ((t0 + lane / hn) * item.n_heads + h0 + lane % hn) * width : nullptr;
      for (int64_t c = 0; c < width; ++c) queries[c * kChunk + i] = q != nullptr ? q[c] : 0.0f;
    }
    float* max = s.sum.data();
    float* sum = max + kChunk;
    switch (nv) {
      case 1: run.template pass<1>(last_seen, max, sum); break;
      case 2: run.template pass<2>(last_seen, max, sum); break;
      case 3: run.template pass<3>(last_seen, max, sum); break;
      default: run.template pass<4>(last_seen, max, sum); break;
    }
    const float* acc = s.acc.data();
    for (int64_t i = 0; i < nl; ++i) {
      const int64_t lane = l0 + i;
      if (partial != nullptr) {
        float* part = partial + lane * (kLatentPartialHeader + item.v_dim);
        part[0] = max[i];
        part[1] = sum[i];
        for (int64_t c = 0; c < item.v_dim; ++c) part[kLatentPartialHeader + c] = acc[c * kChunk + i];
        continue;
      }
      const float inv = 1.0f / sum[i];
      float* o = item.out + ((t0 + lane / hn) * item.n_heads + h0 + lane % hn) * item.v_dim;
      for (int64_t c = 0; c < item.v_dim; ++c) o[c] = acc[c * kChunk + i] * inv;
    }
  }
}

}  // namespace
}  // namespace servetune::cpu
