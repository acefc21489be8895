// SIMD versions of the reference activations (runtime-dispatched; same math as ops_reference.h up to the
// polynomial exp, within a few ulp).
#pragma once

#include <cstdint>

namespace servetune::cpu::detail {

// out[t, i] = silu(gate[t, i]) * up[t, i] for t < n, i < ffn; gate/up rows are in_stride apart.
void silu_mul_f32_avx512(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out);
void silu_mul_f32_avx2(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out);

float max_value_avx512(const float* x, int64_t n);
float max_value_avx2(const float* x, int64_t n);
double exp_scaled_avx512(const float* x, int64_t n, float shift, float scale, float* out);
double exp_scaled_avx2(const float* x, int64_t n, float shift, float scale, float* out);
void to_f16_avx512(const float* x, int64_t n, uint16_t* out);
void to_f16_avx2(const float* x, int64_t n, uint16_t* out);

}  // namespace servetune::cpu::detail
