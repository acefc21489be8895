// AVX2 attention over an f32 paged KV cache for one (token, head): scores, softmax, weighted sum of values.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/attention_simd.h"

namespace servetune::cpu::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

}  // namespace

void attention_head_f32_avx2(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                           float scale, int64_t t, int64_t h, float* scratch, float* out) {
  constexpr int64_t kW = 8;
  const int64_t hd = kv.head_dim;
  const int64_t kv_head = h / (n_heads / kv.n_kv_heads);
  const int64_t width = kv.n_kv_heads * hd;
  const int64_t n_ctx = batch.positions[t] + 1;
  const int32_t* table = batch.block_tables + batch.seq_of_token[t] * batch.max_blocks_per_seq;
  const float* qh = q + (t * n_heads + h) * hd;
  auto row = [&](const void* base, int64_t j) {
    const int64_t slot = static_cast<int64_t>(table[j / kv.page_size]) * kv.page_size + j % kv.page_size;
    return static_cast<const float*>(base) + slot * width + kv_head * hd;
  };

  float max_score = -INFINITY;
  for (int64_t j = 0; j < n_ctx; ++j) {
    const float* k = row(kv.k, j);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += kW) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(k + d), acc);
    scratch[j] = hsum(acc) * scale;
    max_score = std::max(max_score, scratch[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n_ctx; ++j) {
    scratch[j] = std::exp(scratch[j] - max_score);
    sum += scratch[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  constexpr int64_t kMaxHead = 512;
  __m256 acc[kMaxHead / kW];
  const int64_t nv = hd / kW;
  for (int64_t i = 0; i < nv; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n_ctx; ++j) {
    const float* v = row(kv.v, j);
    const __m256 w = _mm256_set1_ps(scratch[j] * inv);
    for (int64_t i = 0; i < nv; ++i) acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + i * kW), acc[i]);
  }
  for (int64_t i = 0; i < nv; ++i) _mm256_storeu_ps(out + i * kW, acc[i]);
}

}  // namespace servetune::cpu::detail
