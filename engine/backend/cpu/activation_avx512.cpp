// Avx512 instantiation of the activations (see activation_impl.h).
#include "backend/cpu/activation_impl.h"
#include "backend/cpu/activation_simd.h"
#include "backend/cpu/simd_avx512.h"

namespace servetune::cpu::detail {

void silu_mul_f32_avx512(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) {
  activation_impl::silu_mul<simd::Avx512>(gate, up, in_stride, n, ffn, out);
}

void rms_norm_avx512(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  activation_impl::rms_norm<simd::Avx512>(x, w, y, n, dim, eps);
}

void add_rms_norm_avx512(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps) {
  activation_impl::add_rms_norm<simd::Avx512>(x, residual, w, y, n, dim, eps);
}

float max_value_avx512(const float* x, int64_t n) { return activation_impl::max_value<simd::Avx512>(x, n); }

double exp_scaled_avx512(const float* x, int64_t n, float shift, float scale, float* out) {
  return activation_impl::exp_scaled<simd::Avx512>(x, n, shift, scale, out);
}

int64_t argmax_first_avx512(const float* x, int64_t n) { return activation_impl::argmax_first<simd::Avx512>(x, n); }

void exp_scaled_blocks_avx512(const float* x, int64_t n, float shift, float scale, float* out, double* sums) {
  activation_impl::exp_scaled_blocks<simd::Avx512>(x, n, shift, scale, out, sums);
}

int64_t collect_at_least_avx512(const float* w, const float* x, int64_t n, float theta, float floor, int32_t* ids,
                              double* mass) {
  return activation_impl::collect_at_least<simd::Avx512>(w, x, n, theta, floor, ids, mass);
}

void to_f16_avx512(const float* x, int64_t n, uint16_t* out) { activation_impl::to_f16<simd::Avx512>(x, n, out); }

void to_fp8_e4m3_avx512(const float* x, int64_t n, uint8_t* out) {
  activation_impl::to_fp8_e4m3<simd::Avx512>(x, n, out);
}

void widen_fp8_e4m3_avx512(const uint8_t* x, int64_t n, float* out) {
  activation_impl::widen_fp8_e4m3<simd::Avx512>(x, n, out);
}

}  // namespace servetune::cpu::detail
