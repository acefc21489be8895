// Avx2 vector traits for kernels written once over a vector type (attention, activations): loads, arithmetic,
// horizontal reductions and a polynomial exp. Include only from *_avx2.cpp files.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "core/half.h"
#include <cstring>

namespace servetune::cpu::detail::simd {

struct Avx2 {
  using V = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kAccRegs = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load(const Bf16Bits* p) {  // bf16 is f32's top half: widen and shift, exactly
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store(uint16_t* p, V v) {  // to IEEE half, round to nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // FP8 E4M3 codes widened exactly to 2^-8 times their value (core/half.h's fp8_e4m3_to_f32; callers fold the 2^8
  // into a scale), 8 at a time: sign-extended to 16 bits and shifted by 7, the code's magnitude bits land in an f16's
  // exponent and mantissa (so its subnormals become f16 subnormals) and its sign in bit 15 (bit 14 is cleared);
  // S.1111.111 becomes an f16 NaN.
  static V load_fp8_scaled(const uint8_t* p) {
    const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    __m128i h = _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(static_cast<int16_t>(0xBF80)));
    const __m128i top = _mm_set1_epi16(0x3F80);  // the magnitude of S.1111.111; doubled, an f16 NaN
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, top), top);
    return _mm256_cvtph_ps(_mm_add_epi16(h, _mm_and_si128(h, nan)));
  }
  // To FP8 E4M3 as core/half.h's f32_to_fp8_e4m3 (round to nearest even, saturating at 448, NaN kept).
  static void store(uint8_t* p, V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i rounded =
        _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF),
                                             _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1))));
    __m256i code = _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3));
    // cvtps rounds to nearest even under the default MXCSR mode, which the engine never changes.
    const __m256i quanta = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)));
    const auto select = [](__m256i mask, __m256i x, __m256i y) { return _mm256_blendv_epi8(x, y, mask); };
    code = select(_mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C800000), a), code, quanta);
    code = select(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x43DFFFFF)), code, _mm256_set1_epi32(0x7E));
    code = select(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000)), code, _mm256_set1_epi32(0x7F));
    code = _mm256_or_si256(code, sign);
    // Byte 0 of each dword, four per 128-bit lane.
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                          -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i bytes = _mm256_shuffle_epi8(code, pick);
    const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(bytes)));
    const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(bytes, 1)));
    const uint64_t packed = lo | static_cast<uint64_t>(hi) << 32;
    std::memcpy(p, &packed, sizeof packed);
  }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V swap_pairs(V a) { return _mm256_permute_ps(a, 0xB1); }  // lanes 2i and 2i + 1 exchanged
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(V v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
  }
  static float hmax(V v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
  }
  // Bit i set where lane i of a equals lane i of b / is NaN / is at least lane i of b.
  static uint32_t equal_mask(V a, V b) {
    return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)));
  }
  static uint32_t nan_mask(V a) { return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q))); }
  static uint32_t ge_mask(V a, V b) { return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ))); }
  // Lanes of v whose bit is set in `bits`, the others 0.
  static V zero_unless(uint32_t bits, V v) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), bit), bit);
    return _mm256_and_ps(_mm256_castsi256_ps(set), v);
  }
  // base + i for each bit i set in `bits`, in order, to out; returns how many (out has room for 8).
  static int64_t compress_indices(uint32_t bits, int32_t base, int32_t* out) {
    int64_t count = 0;
    for (; bits != 0; bits &= bits - 1) out[count++] = base + std::countr_zero(bits);
    return count;
  }
  // lane[l] = the double sum of w[16 * g + l] over g < groups, in g order (lane_sums.h's lanes).
  static void lane_sums(const float* w, int64_t groups, double* lane) {
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    for (int64_t g = 0; g < groups; ++g) {
      for (int half = 0; half < 2; ++half) {
        const __m256 v = _mm256_loadu_ps(w + 16 * g + 8 * half);
        acc[2 * half] = _mm256_add_pd(acc[2 * half], _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        acc[2 * half + 1] = _mm256_add_pd(acc[2 * half + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
      }
    }
    for (int i = 0; i < 4; ++i) _mm256_storeu_pd(lane + 4 * i, acc[i]);
  }

  // e^x with a degree-7 polynomial on [-ln2/2, ln2/2] (about 1 ulp); 0 below -87.3, where e^x is denormal;
  // inputs above 88.3 are clamped there (e^88.3 is near the float maximum).
  static V exp(V x) {
    const V keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const V n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    V p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(pow2n)), keep);
  }
};

}  // namespace servetune::cpu::detail::simd
