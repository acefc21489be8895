// Activations written once over a vector-ISA traits type (S); included only by the per-ISA translation units.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "backend/cpu/lane_sums.h"
#include "backend/cpu/rms_scale.h"
#include "core/half.h"

namespace servetune::cpu::detail::activation_impl {

template <class S>
void silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) {
  constexpr int W = S::kWidth;
  const auto one = S::set1(1.0f);
  for (int64_t t = 0; t < n; ++t) {
    const float* g = gate + t * in_stride;
    const float* u = up + t * in_stride;
    float* o = out + t * ffn;
    int64_t i = 0;
    for (; i + W <= ffn; i += W) {
      const auto x = S::load(g + i);
      const auto silu = S::div(x, S::add(one, S::exp(S::sub(S::zero(), x))));
      S::store(o + i, S::mul(silu, S::load(u + i)));
    }
    for (; i < ffn; ++i) o[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
  }
}

// ref::rms_norm's arithmetic, bit for bit (the same rms_scale, compiled for the translation unit's ISA), the output
// loop written over S.
template <class S>
void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  constexpr int W = S::kWidth;
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * dim;
    float* yr = y + t * dim;
    const float scale = rms_scale(xr, dim, eps);
    const auto vscale = S::set1(scale);
    int64_t i = 0;
    for (; i + W <= dim; i += W) S::store(yr + i, S::mul(S::mul(S::load(xr + i), vscale), S::load(w + i)));
    for (; i < dim; ++i) yr[i] = (xr[i] * scale) * w[i];
  }
}

// x += residual, then y = rms_norm(x), row by row (ref::add_rms_norm's arithmetic).
template <class S>
void add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  constexpr int W = S::kWidth;
  for (int64_t t = 0; t < n; ++t) {
    float* xr = x + t * dim;
    const float* rr = residual + t * dim;
    int64_t i = 0;
    for (; i + W <= dim; i += W) S::store(xr + i, S::add(S::load(xr + i), S::load(rr + i)));
    for (; i < dim; ++i) xr[i] += rr[i];
    rms_norm<S>(xr, w, y + t * dim, 1, dim, eps);
  }
}

// The largest of x[0, n) (n >= 1).
template <class S>
float max_value(const float* x, int64_t n) {
  constexpr int W = S::kWidth;
  float best = x[0];
  int64_t i = 0;
  if (n >= W) {
    auto m = S::load(x);
    for (i = W; i + W <= n; i += W) m = S::max(m, S::load(x + i));
    best = S::hmax(m);
  }
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

// out[i] = e^((x[i] - shift) * scale) for i < n; returns their sum (per-lane float sums added in double).
template <class S>
double exp_scaled(const float* x, int64_t n, float shift, float scale, float* out) {
  constexpr int W = S::kWidth;
  const auto vshift = S::set1(shift), vscale = S::set1(scale);
  auto sum = S::zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const auto e = S::exp(S::mul(S::sub(S::load(x + i), vshift), vscale));
    S::store(out + i, e);
    sum = S::add(sum, e);
  }
  float lanes[W];
  S::store(lanes, sum);
  double total = 0.0;
  for (float lane : lanes) total += lane;
  for (; i < n; ++i) {
    out[i] = std::exp((x[i] - shift) * scale);
    total += out[i];
  }
  return total;
}

// std::max_element's index over x[0, n) (n >= 1): with no NaN, the first index holding the largest value.
template <class S>
int64_t argmax_first(const float* x, int64_t n) {
  constexpr int W = S::kWidth;
  const int64_t whole = n / W * W;
  if (whole == 0) return std::max_element(x, x + n) - x;
  auto m = S::load(x);
  uint32_t nan = S::nan_mask(m);
  for (int64_t i = W; i < whole; i += W) {
    const auto v = S::load(x + i);
    m = S::max(m, v);
    nan |= S::nan_mask(v);
  }
  float best = S::hmax(m);
  for (int64_t i = whole; i < n; ++i) {
    if (std::isnan(x[i])) nan = 1;
    best = x[i] > best ? x[i] : best;
  }
  if (nan != 0) return std::max_element(x, x + n) - x;  // NaN defeats the vector max; keep max_element's answer
  const auto target = S::set1(best);
  for (int64_t i = 0; i < whole; i += W) {
    if (const uint32_t hit = S::equal_mask(S::load(x + i), target); hit != 0) return i + std::countr_zero(hit);
  }
  for (int64_t i = whole; i < n; ++i) {
    if (x[i] == best) return i;
  }
  return 0;  // unreachable: best is one of the elements
}

// out[i] = e^((x[i] - shift) * scale) for i < n, as exp_scaled computes them, and sums[b] = lane_block_sum of
// out's block b (kSumBlock elements; the last may be shorter).
template <class S>
void exp_scaled_blocks(const float* x, int64_t n, float shift, float scale, float* out, double* sums) {
  constexpr int W = S::kWidth;
  const auto vshift = S::set1(shift), vscale = S::set1(scale);
  for (int64_t b0 = 0; b0 < n; b0 += kSumBlock) {
    const int64_t len = std::min(kSumBlock, n - b0);
    int64_t i = b0;
    for (; i + W <= b0 + len; i += W) S::store(out + i, S::exp(S::mul(S::sub(S::load(x + i), vshift), vscale)));
    for (; i < b0 + len; ++i) out[i] = std::exp((x[i] - shift) * scale);
    double lane[kSumLanes];
    const int64_t groups = len / kSumLanes;
    S::lane_sums(out + b0, groups, lane);
    for (int64_t j = groups * kSumLanes; j < len; ++j) lane[j % kSumLanes] += static_cast<double>(out[b0 + j]);
    sums[b0 / kSumBlock] = lane_tree_sum(lane);
  }
}

// The indices i < n, in order, with w[i] >= theta and x[i] >= floor, into ids (room for n; lanes past the count may
// be written); returns how many, and in *mass their weights' sum (each block of kSumBlock summed in float lanes, the
// blocks in double: a bound's estimate, not exact).
template <class S>
int64_t collect_at_least(const float* w, const float* x, int64_t n, float theta, float floor, int32_t* ids,
                         double* mass) {
  constexpr int W = S::kWidth;
  const auto vtheta = S::set1(theta), vfloor = S::set1(floor);
  int64_t count = 0, i = 0;
  double total = 0.0;
  for (int64_t b0 = 0; b0 + W <= n; b0 += kSumBlock) {
    auto block = S::zero();
    for (i = b0; i + W <= std::min(n, b0 + kSumBlock); i += W) {
      const auto wv = S::load(w + i);
      const uint32_t hit = S::ge_mask(wv, vtheta) & S::ge_mask(S::load(x + i), vfloor);
      if (hit == 0) continue;
      count += S::compress_indices(hit, static_cast<int32_t>(i), ids + count);
      block = S::add(block, S::zero_unless(hit, wv));
    }
    total += static_cast<double>(S::hsum(block));
  }
  for (; i < n; ++i) {
    if (w[i] >= theta && x[i] >= floor) {
      ids[count++] = static_cast<int32_t>(i);
      total += static_cast<double>(w[i]);
    }
  }
  *mass = total;
  return count;
}

// out[i] = x[i] as IEEE half (round to nearest even) for i < n.
template <class S>
void to_f16(const float* x, int64_t n, uint16_t* out) {
  constexpr int W = S::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) S::store(out + i, S::load(x + i));
  for (; i < n; ++i) out[i] = f32_to_fp16(x[i]);
}

template <class S>
void widen_fp8_e4m3(const uint8_t* x, int64_t n, float* out) {
  const auto unit = S::set1(256.0f);
  for (int64_t i = 0; i < n; i += S::kWidth) S::store(out + i, S::mul(S::load_fp8_scaled(x + i), unit));
}

// out[i] = x[i] as FP8 E4M3 (f32_to_fp8_e4m3: round to nearest even, saturating) for i < n.
template <class S>
void to_fp8_e4m3(const float* x, int64_t n, uint8_t* out) {
  constexpr int W = S::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) S::store(out + i, S::load(x + i));
  for (; i < n; ++i) out[i] = f32_to_fp8_e4m3(x[i]);
}

}  // namespace servetune::cpu::detail::activation_impl
