// Avx512 vector traits for kernels written once over a vector type (attention, activations): loads, arithmetic,
// horizontal reductions, a polynomial exp and a 16-way transpose-reduce. Include only from *_avx512.cpp files.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "core/half.h"

// GCC 12 reports the undefined pass-through operand inside the AVX-512 shuffle intrinsics as (maybe) uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace servetune::cpu::detail::simd {

struct Avx512 {
  using V = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kAccRegs = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load(const Bf16Bits* p) {  // bf16 is f32's top half: widen and shift, exactly
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store(uint16_t* p, V v) {  // to IEEE half, round to nearest even
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // FP8 E4M3 codes widened exactly to 2^-8 times their value (core/half.h's fp8_e4m3_to_f32; callers fold the 2^8
  // into a scale), 16 at a time: sign-extended to 16 bits and shifted by 7, the code's magnitude bits land in an f16's
  // exponent and mantissa (so its subnormals become f16 subnormals) and its sign in bit 15 (bit 14 is cleared);
  // S.1111.111 becomes an f16 NaN.
  static V load_fp8_scaled(const uint8_t* p) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBF80)));
    const __m256i top = _mm256_set1_epi16(0x3F80);  // the magnitude of S.1111.111; doubled, an f16 NaN
    h = _mm256_mask_add_epi16(h, _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, top), top), h, h);
    return _mm512_cvtph_ps(h);
  }
  // To FP8 E4M3 as core/half.h's f32_to_fp8_e4m3 (round to nearest even, saturating at 448, NaN kept).
  static void store(uint8_t* p, V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    const __m512i rounded =
        _mm512_add_epi32(a, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF),
                                             _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1))));
    __m512i code = _mm512_sub_epi32(_mm512_srli_epi32(rounded, 20), _mm512_set1_epi32(120 << 3));
    const __m512i quanta = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    code = _mm512_mask_mov_epi32(code, _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(0x3C800000)), quanta);
    code = _mm512_mask_mov_epi32(code, _mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(0x43E00000)), _mm512_set1_epi32(0x7E));
    code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7F800000)), _mm512_set1_epi32(0x7F));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign)));
  }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V swap_pairs(V a) { return _mm512_permute_ps(a, 0xB1); }  // lanes 2i and 2i + 1 exchanged
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static float hmax(V v) { return _mm512_reduce_max_ps(v); }
  // Bit i set where lane i of a equals lane i of b / is NaN / is at least lane i of b.
  static uint32_t equal_mask(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static uint32_t nan_mask(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static uint32_t ge_mask(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  // Lanes of v whose bit is set in `bits`, the others 0.
  static V zero_unless(uint32_t bits, V v) { return _mm512_maskz_mov_ps(static_cast<__mmask16>(bits), v); }
  // base + i for each bit i set in `bits`, in order, to out; returns how many. Writes all 16 lanes of out (the
  // caller has room): a compress into memory is microcoded and slow on Zen 4, one into a register is not.
  static int64_t compress_indices(uint32_t bits, int32_t base, int32_t* out) {
    const __m512i lanes = _mm512_add_epi32(_mm512_set1_epi32(base),
                                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    _mm512_storeu_si512(out, _mm512_maskz_compress_epi32(static_cast<__mmask16>(bits), lanes));
    return std::popcount(bits);
  }
  // lane[l] = the double sum of w[16 * g + l] over g < groups, in g order (lane_sums.h's lanes).
  static void lane_sums(const float* w, int64_t groups, double* lane) {
    __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
    for (int64_t g = 0; g < groups; ++g) {
      const __m512 v = _mm512_loadu_ps(w + 16 * g);
      low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
      high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
    _mm512_storeu_pd(lane, low);
    _mm512_storeu_pd(lane + 8, high);
  }

  // e^x with a degree-7 polynomial on [-ln2/2, ln2/2] (about 1 ulp); 0 below -87.3, where e^x is denormal;
  // inputs above 88.3 are clamped there (e^88.3 is near the float maximum).
  static V exp(V x) {
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    V p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflow), p, n);
  }

  // Lane i of the result is op (a lane-wise add or max) over the 16 lanes of a[i], as a tree of 15 ops.
  template <class Op>
  static V reduce(const V* a, Op op) {
    V b[8];
    for (int k = 0; k < 8; ++k) {
      b[k] = op(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
    }
    V c[4];
    for (int k = 0; k < 4; ++k) {
      const __m512d p = _mm512_castps_pd(b[2 * k]), q = _mm512_castps_pd(b[2 * k + 1]);
      c[k] = op(_mm512_castpd_ps(_mm512_unpacklo_pd(p, q)), _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)));
    }
    const V e01 = op(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    const V e23 = op(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return op(_mm512_shuffle_f32x4(e01, e23, 0x88), _mm512_shuffle_f32x4(e01, e23, 0xDD));
  }
  // Lane i of the result is the sum of the 16 lanes of a[i].
  static V reduce(const V* a) { return reduce(a, add); }
};

}  // namespace servetune::cpu::detail::simd
