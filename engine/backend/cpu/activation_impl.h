// Activations written once over a vector-ISA traits type (S); included only by the per-ISA translation units.
#pragma once

#include <cmath>
#include <cstdint>

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

}  // namespace servetune::cpu::detail::activation_impl
