// The latent attention kernel's body, included by one file per ISA so the compiler vectorises its lane loops for
// that ISA (the same additions in the same order everywhere). Internal linkage: safe in any ISA's file.
#pragma once

#include <algorithm>
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
  const float* get(int64_t p, std::vector<float>& buf) const {
    const int64_t slot = static_cast<int64_t>(table[p / kv.page_size]) * kv.page_size + p % kv.page_size;
    const uint8_t* stored = static_cast<const uint8_t*>(kv.k) + slot * row_bytes;
    if (kv.dtype == DType::kF32) return reinterpret_cast<const float*>(stored);
    dequantize_row(kv.dtype, stored, buf.data(), kv.head_dim);
    return buf.data();
  }
};

// Tokens [t0, t1) of one sequence at consecutive positions (a prefill chunk's run, or one decode token), heads
// [h0, h1): three passes over the positions: every (token, head)'s scores (each cached row read once for all of them,
// since the heads share it and every later token sees it too), the softmax weights by the vector exp, then the
// weighted sum of the rows' first v_dim values.
inline void latent_attention_body(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                                  LatentAttentionScratch& s) {
  const KvLayerView& kv = *item.kv;
  const AttentionBatch& batch = *item.batch;
  const int64_t width = kv.head_dim, v_dim = item.v_dim, hn = h1 - h0, first = batch.positions[t0];
  const int64_t span = batch.positions[t1 - 1] + 1;  // positions any of the tokens sees; scores' row stride
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
      for (int64_t h = 0; h < hn; ++h) scores[h * span] = lane_dot(qt + h * width, r, width);
    }
  }
  for (int64_t lane = 0; lane < lanes; ++lane) {
    const std::span<float> seen(s.scores.data() + lane * span, static_cast<size_t>(first + lane / hn + 1));
    const float max = max_value(seen);
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

}  // namespace
}  // namespace servetune::cpu
