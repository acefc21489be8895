// SIMD versions of the reference activations (runtime-dispatched; same math as ops_reference.h up to the
// polynomial exp, within a few ulp).
#pragma once

#include <cstdint>

namespace servetune::cpu::detail {

// out[t, i] = silu(gate[t, i]) * up[t, i] for t < n, i < ffn; gate/up rows are in_stride apart.
void silu_mul_f32_avx512(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out);
void silu_mul_f32_avx2(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out);

// ref::rms_norm / ref::add_rms_norm, bit for bit.
void rms_norm_avx512(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps);
void rms_norm_avx2(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps);
void add_rms_norm_avx512(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps);
void add_rms_norm_avx2(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps);

float max_value_avx512(const float* x, int64_t n);
float max_value_avx2(const float* x, int64_t n);
double exp_scaled_avx512(const float* x, int64_t n, float shift, float scale, float* out);
double exp_scaled_avx2(const float* x, int64_t n, float shift, float scale, float* out);
int64_t argmax_first_avx512(const float* x, int64_t n);
int64_t argmax_first_avx2(const float* x, int64_t n);
void exp_scaled_blocks_avx512(const float* x, int64_t n, float shift, float scale, float* out, double* sums);
void exp_scaled_blocks_avx2(const float* x, int64_t n, float shift, float scale, float* out, double* sums);
int64_t collect_at_least_avx512(const float* w, const float* x, int64_t n, float theta, float floor, int32_t* ids,
                                double* mass);
int64_t collect_at_least_avx2(const float* w, const float* x, int64_t n, float theta, float floor, int32_t* ids,
                              double* mass);
void to_f16_avx512(const float* x, int64_t n, uint16_t* out);
void to_f16_avx2(const float* x, int64_t n, uint16_t* out);
void to_fp8_e4m3_avx512(const float* x, int64_t n, uint8_t* out);
void to_fp8_e4m3_avx2(const float* x, int64_t n, uint8_t* out);
// out[i] = x[i] widened for i < n (a multiple of 16) by the vector load the attention kernels read FP8 KV rows with.
void widen_fp8_e4m3_avx512(const uint8_t* x, int64_t n, float* out);
void widen_fp8_e4m3_avx2(const uint8_t* x, int64_t n, float* out);

}  // namespace servetune::cpu::detail
