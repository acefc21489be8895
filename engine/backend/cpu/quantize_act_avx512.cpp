// AVX-512 activation quantizers: ggml's x86 Q8_0 / Q8_1 scheme (quantize_row_q8_0 / _q8_1) and its Q8_K
// reference scheme, bit for bit equal to the plain C++ versions in matmul_reference.cpp / matmul_k_reference.cpp.
#include <cstring>

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/simd_avx512.h"
#include "core/quant.h"

namespace servetune::cpu::detail {

using namespace avx512;

void avx512_quantize_q8(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                        int64_t q_stride, float* d, float* s, int64_t d_stride) {
  const int64_t nb = cols / kQBlock;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    int8_t* qt = q + t * q_stride;
    float* dt = d + t * d_stride;
    float* st = s != nullptr ? s + t * d_stride : nullptr;
    // 16 blocks at a time (the last group may hold 8 or more): their scales are one vector, so the division and f16
    // rounding run once for the group (one block at a time they formed a serial chain per block). Same per-block
    // arithmetic as the reference; max and the small integer sums (|sum| <= 4096, exact in f32) do not depend on
    // the order they are reduced in. Fewer than 8 left do not pay for a group's reductions: one block at a time.
    int64_t b = 0;
    for (; nb - b >= 8; b += 16) {
      const int m = static_cast<int>(imin(16, nb - b));  // >= 8
      const __mmask16 present = static_cast<__mmask16>((1u << m) - 1);
      const float* xb = xt + b * kQBlock;
      __m512 amax_of[16];
      for (int i = 0; i < 16; ++i) {
        amax_of[i] = i < m ? _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + i * kQBlock)),
                                           _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + i * kQBlock + 16)))
                           : _mm512_setzero_ps();
      }
      const __m512 amax = simd::Avx512::reduce(amax_of, simd::Avx512::max);
      const __m512 dd = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
      const __mmask16 nonzero = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_NEQ_UQ);
      const __m512 id = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.0f), amax);
      _mm512_mask_storeu_ps(dt + b, present, _mm512_cvtph_ps(_mm512_cvtps_ph(dd, kRound)));
      __m512 sum_of[16];
      for (int i = 0; i < 16; i += 2) {
        if (i >= m) {
          sum_of[i] = sum_of[i + 1] = _mm512_setzero_ps();
          continue;
        }
        __m512i codes[4];
        for (int h = 0; h < 4; ++h) {
          const __m512 idi = _mm512_permutexvar_ps(_mm512_set1_epi32(i + h / 2), id);
          codes[h] = i + h / 2 < m ? _mm512_cvt_roundps_epi32(
                                         _mm512_mul_ps(_mm512_loadu_ps(xb + i * kQBlock + 16 * h), idi), kRound)
                                   : _mm512_setzero_si512();
        }
        const __m512i packed = _mm512_packs_epi16(_mm512_packs_epi32(codes[0], codes[1]),
                                                  _mm512_packs_epi32(codes[2], codes[3]));
        // The packs interleave 128-bit lanes; this puts the pair's codes back in element order.
        const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __mmask64 bytes = i + 1 < m ? ~__mmask64{0} : __mmask64{0xFFFFFFFF};
        _mm512_mask_storeu_epi8(qt + (b + i) * kQBlock, bytes, _mm512_permutexvar_epi32(order, packed));
        sum_of[i] = _mm512_cvtepi32_ps(_mm512_add_epi32(codes[0], codes[1]));
        sum_of[i + 1] = _mm512_cvtepi32_ps(_mm512_add_epi32(codes[2], codes[3]));
      }
      if (st != nullptr) {
        const __m512 sums = simd::Avx512::reduce(sum_of);
        _mm512_mask_storeu_ps(st + b, present, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(dd, sums), kRound)));
      }
    }
    for (; b < nb; ++b) {
      const __m512 v0 = _mm512_loadu_ps(xt + b * kQBlock);
      const __m512 v1 = _mm512_loadu_ps(xt + b * kQBlock + 16);
      const float amax = hmax(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
      const float dd = amax / 127.0f;
      const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      const __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, id), kRound);
      const __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, id), kRound);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + b * kQBlock), _mm512_cvtsepi32_epi8(i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + b * kQBlock + 16), _mm512_cvtsepi32_epi8(i1));
      dt[b] = f16_round_trip(dd);
      if (st != nullptr) st[b] = f16_round_trip(dd * static_cast<float>(hsum_i32(_mm512_add_epi32(i0, i1))));
    }
    std::memset(qt + cols, 0, static_cast<size_t>(q_stride - cols));
    for (int64_t pad = nb; pad < d_stride; ++pad) {
      dt[pad] = 0.0f;
      if (st != nullptr) st[pad] = 0.0f;
    }
  }
}

void avx512_quantize_q8k(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                         int64_t q_stride, float* d, int64_t d_stride, int16_t* bsums, int64_t bsum_stride) {
  const int64_t nb = cols / kQK_K;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    int8_t* qt = q + t * q_stride;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xt + b * kQK_K;
      __m512 amax_v = _mm512_setzero_ps();
      for (int i = 0; i < 16; ++i) amax_v = _mm512_max_ps(amax_v, _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 16 * i)));
      amax_v = _mm512_max_ps(amax_v, _mm512_shuffle_f32x4(amax_v, amax_v, _MM_SHUFFLE(1, 0, 3, 2)));
      amax_v = _mm512_max_ps(amax_v, _mm512_shuffle_f32x4(amax_v, amax_v, _MM_SHUFFLE(2, 3, 0, 1)));
      __m128 m4 = _mm512_castps512_ps128(amax_v);
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
      int16_t* bs = bsums + t * bsum_stride + b * 16;
      if (amax == 0.0f) {
        d[t * d_stride + b] = 0.0f;
        std::memset(qt + b * kQK_K, 0, kQK_K);
        std::memset(bs, 0, 16 * sizeof(int16_t));
        continue;
      }
      // ggml keeps the first element of largest magnitude, with its sign.
      float max = 0.0f;
      for (int i = 0; i < 16; ++i) {
        const __mmask16 hit =
            _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 16 * i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
        if (hit != 0) {
          max = xb[16 * i + __builtin_ctz(hit)];
          break;
        }
      }
      const float iscale = -127.0f / max;
      const __m512 scale = _mm512_set1_ps(iscale);
      for (int i = 0; i < 16; ++i) {
        __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * i), scale),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i qi = _mm512_cvtps_epi32(_mm512_min_ps(v, _mm512_set1_ps(127.0f)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + b * kQK_K + 16 * i), _mm512_cvtsepi32_epi8(qi));
        bs[i] = static_cast<int16_t>(hsum_i32(qi));
      }
      d[t * d_stride + b] = 1.0f / iscale;
    }
    std::memset(qt + cols, 0, static_cast<size_t>(q_stride - cols));
    for (int64_t b = nb; b < d_stride; ++b) d[t * d_stride + b] = 0.0f;
    for (int64_t j = nb * 16; j < bsum_stride; ++j) bsums[t * bsum_stride + j] = 0;
  }
}

}  // namespace servetune::cpu::detail
