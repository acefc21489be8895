// Plain C++ reference kernels (see ops_reference.h).
#include "backend/cpu/ops_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/kv_layout.h"
#include "backend/cpu/rms_scale.h"
#include "core/error.h"
#include "core/quant.h"

namespace servetune::cpu::ref {
namespace {

}  // namespace

void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    if (ids[t] < 0 || ids[t] >= table.rows) {
      throw Error(ErrorKind::kInvalidRequest, "token id " + std::to_string(ids[t]) + " is outside the vocabulary (0.." +
                                                  std::to_string(table.rows - 1) + ")");
    }
    const auto* row = static_cast<const uint8_t*>(table.data) + ids[t] * table.row_bytes;
    dequantize_row(table.type, row, out + t * table.cols, table.cols);
  }
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * dim;
    float* yr = y + t * dim;
    const float scale = rms_scale(xr, dim, eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * scale) * w[i];
  }
}

void add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  for (int64_t t = 0; t < n; ++t) {
    float* xr = x + t * dim;
    for (int64_t i = 0; i < dim; ++i) xr[i] += residual[t * dim + i];
    rms_norm(xr, w, y + t * dim, 1, dim, eps);
  }
}

void rope_cache(float position, const RopeParams& p, float* cos_sin) {
  const float theta_scale = std::pow(p.theta, -2.0f / static_cast<float>(p.rope_dim));
  float theta = position;
  for (int64_t i = 0; i < p.rope_dim; i += 2) {
    const float ff = p.freq_factors ? p.freq_factors[i / 2] : 1.0f;
    const float angle = p.freq_scale * (theta / ff);
    cos_sin[i] = std::cos(angle);
    cos_sin[i + 1] = std::sin(angle);
    theta *= theta_scale;
  }
}

void rope_heads(float* x, int64_t n_heads, const float* cos_sin, const RopeParams& p) {
  const int64_t half = p.rope_dim / 2;
  for (float* head = x; head < x + n_heads * p.head_dim; head += p.head_dim) {
    for (int64_t i = 0; i < p.rope_dim; i += 2) {
      const float c = cos_sin[i], s = cos_sin[i + 1];
      const int64_t a = p.neox ? i / 2 : i;
      const int64_t b = p.neox ? i / 2 + half : i + 1;
      const float x0 = head[a], x1 = head[b];
      head[a] = x0 * c - x1 * s;
      head[b] = x0 * s + x1 * c;
    }
  }
}

void rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) {
  std::vector<float> cache(static_cast<size_t>(p.rope_dim));
  for (int64_t t = 0; t < n; ++t) {
    rope_cache(static_cast<float>(positions[t]), p, cache.data());
    rope_heads(x + t * n_heads * p.head_dim, n_heads, cache.data(), p);
  }
}

void store_v_row(const KvLayerView& kv, const float* row, int64_t slot) {
  const int64_t width = kv.n_kv_heads * kv.head_dim;
  quantize_row(kv.dtype, row, static_cast<uint8_t*>(kv.v) + slot * width * dtype_info(kv.dtype).type_size, width);
}

void store_k_row(const KvLayerView& kv, const float* row, int64_t slot) {
  const int64_t width = kv.n_kv_heads * kv.head_dim, elem = static_cast<int64_t>(dtype_info(kv.dtype).type_size);
  std::vector<uint8_t> converted(static_cast<size_t>(width * elem));
  quantize_row(kv.dtype, row, converted.data(), width);
  scatter_k_row(kv, converted.data(), elem, slot);
}

void attention_head(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                    int64_t t, int64_t h, float* scratch, float* out) {
  const int64_t hd = kv.head_dim;
  const int64_t kv_head = h / (n_heads / kv.n_kv_heads);
  const int64_t width = kv.n_kv_heads * hd;
  const int64_t n_ctx = attention_span(batch, t);
  const int32_t* table = batch.block_tables + batch.seq_of_token[t] * batch.max_blocks_per_seq;
  const float* qh = q + (t * n_heads + h) * hd;
  const int64_t elem = dtype_info(kv.dtype).type_size;
  auto slot_of = [&](int64_t j) { return static_cast<int64_t>(table[j / kv.page_size]) * kv.page_size + j % kv.page_size; };
  std::vector<uint8_t> gathered(static_cast<size_t>(hd * elem));  // one K row of this head, from its page
  std::vector<float> wide(static_cast<size_t>(hd));               // one K or V row of this head, as float
  auto load_k = [&](int64_t j) {
    const auto* key = static_cast<const uint8_t*>(kv.k) + k_cache_index(kv, slot_of(j), kv_head, 0) * elem;
    for (int64_t d = 0; d < hd; ++d) std::copy_n(key + d * kv.page_size * elem, elem, gathered.data() + d * elem);
    dequantize_row(kv.dtype, gathered.data(), wide.data(), hd);
    return wide.data();
  };
  auto load_v = [&](int64_t j) {
    dequantize_row(kv.dtype, static_cast<const uint8_t*>(kv.v) + (slot_of(j) * width + kv_head * hd) * elem,
                   wide.data(), hd);
    return wide.data();
  };

  float max_score = -INFINITY;
  for (int64_t j = 0; j < n_ctx; ++j) {
    if (!attention_sees(batch, t, j)) {  // another branch of a draft tree
      scratch[j] = -INFINITY;
      continue;
    }
    float dot = 0.0f;
    const float* k = load_k(j);
    for (int64_t d = 0; d < hd; ++d) dot += qh[d] * k[d];
    scratch[j] = dot * scale;
    max_score = std::max(max_score, scratch[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n_ctx; ++j) {
    scratch[j] = std::exp(scratch[j] - max_score);
    sum += scratch[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  std::fill(out, out + hd, 0.0f);
  for (int64_t j = 0; j < n_ctx; ++j) {
    if (scratch[j] == 0.0f) continue;  // unseen (a tree's other branch), or a weight that adds nothing
    const float wj = scratch[j] * inv;
    const float* v = load_v(j);
    for (int64_t d = 0; d < hd; ++d) out[d] += wj * v[d];
  }
}

void rope_store_qkv_row(const KvLayerView& kv, const float* qkv_row, float position, int64_t slot, int64_t n_heads,
                        const RopeParams& p, float* q_out_row, float* cos_sin, float* k_scratch) {
  const int64_t hd = p.head_dim, kv_width = kv.n_kv_heads * hd;
  rope_cache(position, p, cos_sin);
  std::copy(qkv_row, qkv_row + n_heads * hd, q_out_row);
  rope_heads(q_out_row, n_heads, cos_sin, p);
  std::copy(qkv_row + n_heads * hd, qkv_row + n_heads * hd + kv_width, k_scratch);
  rope_heads(k_scratch, kv.n_kv_heads, cos_sin, p);
  store_k_row(kv, k_scratch, slot);
  store_v_row(kv, qkv_row + n_heads * hd + kv_width, slot);
}

void silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < ffn; ++i) {
      const float g = gate[t * in_stride + i];
      out[t * ffn + i] = (g / (1.0f + std::exp(-g))) * up[t * in_stride + i];
    }
  }
}

}  // namespace servetune::cpu::ref
