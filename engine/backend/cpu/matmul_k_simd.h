// k-quant super-block decoding (AVX2 intrinsics) shared by the AVX2 and AVX-512 k-quant kernel files only; never
// include from baseline code. Everything here has internal linkage, so no AVX2 instruction can leak into a baseline
// translation unit through COMDAT.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/quant.h"

namespace servetune::cpu::detail::kquant {

// What the kernels need to know of a k-quant type beyond its block layout.
template <DType kType>
struct Traits;
template <>
struct Traits<DType::kQ4_K> {
  using Block = BlockQ4_K;
  static constexpr bool kHasMin = true;  // msum = Σ min·bsum, scaled by dmin in its own chain
  static constexpr int kSubBlock = 32;   // elements per scale
  static constexpr int kQuadsPerWiden = 8;  // vpmaddubsw pair sums that fit 16 bits: 8 · 2 · 15 · 127 = 30,480
};
template <>
struct Traits<DType::kQ5_K> {
  using Block = BlockQ5_K;
  static constexpr bool kHasMin = true;
  static constexpr int kSubBlock = 32;
  static constexpr int kQuadsPerWiden = 4;  // 4 · 2 · 31 · 127 = 31,496
};
template <>
struct Traits<DType::kQ6_K> {
  using Block = BlockQ6_K;
  static constexpr bool kHasMin = false;  // codes are stored + 32: isum −= 32 · Σ scale·bsum instead
  static constexpr int kSubBlock = 16;
  static constexpr int kQuadsPerWiden = 2;  // 2 · 2 · 63 · 127 = 32,004
};

// A super-block in the form every k-quant kernel computes with: its 256 codes as unsigned bytes in element order
// (Q6_K's as stored, value + 32), the scale of each 16-element sub-block (Q4_K, Q5_K: their 32-element sub-block's)
// and the coefficient of each 16-element sub-block's activation sum: Q4_K, Q5_K its min, Q6_K its scale (the −32
// offset correction). Then isum = Σ scale·Σ code·q_x (− 32 · Σ coef·bsum for Q6_K) and msum = Σ coef·bsum.
struct Decoded {
  __m256i codes[8];  // elements 32k .. 32k + 31 in codes[k]
  __m256i scales;    // 16 × int16
  __m256i coefs;     // 16 × int16
  float d, dmin;
};

// Q4_K / Q5_K's 12 scale bytes (ggml's get_scale_min_k4 for all eight sub-blocks at once): bytes 0-7 the 6-bit
// scales, bytes 8-15 the 6-bit mins. Reads 16 bytes from `s` (the block continues past its scales).
static inline __m128i unpack_scales_mins(const uint8_t* s) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));  // dwords u0, u1, u2 (and code bytes)
  // Dwords: [u0 & 0x3f.., (u2 & 0x0f..) | high bits of u0, u1 & 0x3f.., (u2 >> 4 & 0x0f..) | high bits of u1].
  const __m128i lows = _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
  const __m128i highs = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                                      _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(_mm_and_si128(lows, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)), highs);
}

// Q4_K / Q5_K codes: codes[2i] and codes[2i + 1] are the low and high nibbles of qs[32i .. 32i + 31].
static inline void unpack_nibbles(const uint8_t* qs, __m256i* codes) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int i = 0; i < 4; ++i) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * i));
    codes[2 * i] = _mm256_and_si256(raw, low4);
    codes[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
  }
}

template <DType kType>
static inline void decode(const typename Traits<kType>::Block& b, Decoded& out) {
  if constexpr (kType == DType::kQ6_K) {
    // Element 128h + r: low 4 bits from ql[64h + r % 64] (nibble r / 64), high 2 bits from bits 2·(r / 32) of
    // qh[32h + r % 32]. Every 16-bit shift below is masked to bits that came from the same byte.
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i la = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
      const __m256i lb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
      out.codes[4 * h] = _mm256_or_si256(_mm256_and_si256(la, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45));
      out.codes[4 * h + 1] =
          _mm256_or_si256(_mm256_and_si256(lb, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45));
      out.codes[4 * h + 2] =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), low4), _mm256_and_si256(hb, bits45));
      out.codes[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), low4),
                                             _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45));
    }
    out.scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    out.coefs = out.scales;
    out.d = _cvtsh_ss(b.d);
    out.dmin = 0.0f;
  } else {
    unpack_nibbles(b.qs, out.codes);
    if constexpr (kType == DType::kQ5_K) {
      // Fifth bits: element 32k + l has bit k of qh[l], moved to bit 4 of its byte (16-bit shifts; the mask keeps
      // only bits that stayed within their byte).
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
      const __m256i bit4 = _mm256_set1_epi8(0x10);
      out.codes[0] = _mm256_or_si256(out.codes[0], _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4));
      out.codes[1] = _mm256_or_si256(out.codes[1], _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4));
      out.codes[2] = _mm256_or_si256(out.codes[2], _mm256_and_si256(_mm256_slli_epi16(qh, 2), bit4));
      out.codes[3] = _mm256_or_si256(out.codes[3], _mm256_and_si256(_mm256_slli_epi16(qh, 1), bit4));
      out.codes[4] = _mm256_or_si256(out.codes[4], _mm256_and_si256(qh, bit4));
      out.codes[5] = _mm256_or_si256(out.codes[5], _mm256_and_si256(_mm256_srli_epi16(qh, 1), bit4));
      out.codes[6] = _mm256_or_si256(out.codes[6], _mm256_and_si256(_mm256_srli_epi16(qh, 2), bit4));
      out.codes[7] = _mm256_or_si256(out.codes[7], _mm256_and_si256(_mm256_srli_epi16(qh, 3), bit4));
    }
    const __m128i sm = unpack_scales_mins(b.scales);
    out.scales = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sm, sm));  // each 32-element sub-block's scale twice
    out.coefs = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
    out.d = _cvtsh_ss(b.d);
    out.dmin = _cvtsh_ss(b.dmin);
  }
}

// The int16 multipliers of codes[k]'s vpmaddubsw pair sums: 8 pairs of sub-block 2k's scale, then 8 of 2k + 1's.
static inline void pair_scales(__m256i scales, __m256i* out) {
  const __m256i low = _mm256_permute4x64_epi64(scales, _MM_SHUFFLE(1, 0, 1, 0));   // sub-blocks 0-7 in both halves
  const __m256i high = _mm256_permute4x64_epi64(scales, _MM_SHUFFLE(3, 2, 3, 2));  // sub-blocks 8-15
  for (int k = 0; k < 8; ++k) {
    // Every word of the low half takes word 2k % 8 of its source half, every word of the high half word 2k % 8 + 1.
    alignas(32) int8_t select[32];
    for (int i = 0; i < 32; ++i) select[i] = static_cast<int8_t>(4 * (k % 4) + (i < 16 ? 0 : 2) + i % 2);
    out[k] = _mm256_shuffle_epi8(k < 4 ? low : high, _mm256_load_si256(reinterpret_cast<const __m256i*>(select)));
  }
}

}  // namespace servetune::cpu::detail::kquant
