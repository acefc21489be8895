// AVX-512 VNNI k-quant kernels: Q4_K, Q5_K, Q6_K weights × Q8_K activations.
// Each super-block's integer sum is formed exactly (vpmaddubsw, then vpdpwssd with the sub-block scales) and scaled
// once with the canonical arithmetic of matmul_k_reference.cpp, so results equal it bit for bit. Rows are decoded
// once per 4-token tile.
#include <cmath>

#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;

constexpr int kTokens = 4;

inline void prefetch_ahead(const void* block) {
  const char* p = static_cast<const char*>(block) + kPrefetchBytes;
  _mm_prefetch(p, _MM_HINT_T0);
  _mm_prefetch(p + 64, _MM_HINT_T0);
  _mm_prefetch(p + 128, _MM_HINT_T0);
}

inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// Index vector for vpermw: int16 lane i takes source element first + i / lanes_per_value.
inline __m512i lane_index(int first, int lanes_per_value) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(first + i / lanes_per_value);
  return _mm512_load_si512(idx);
}

// A Q4_K / Q5_K super-block decoded for the dot: 4 × 64 u8 quants in element order, the int16 scale of each quant pair's
// sub-block, each min duplicated for the bsum pairs, and d / dmin.
struct Q4KDecoded {
  __m512i q[4];
  __m512i scale[4];
  __m256i mins;
  float d, dmin;
};

template <class Block>
inline void decode_q45k(const Block& b, const __m512i* scale_idx, Q4KDecoded& out) {
  uint32_t u[4];
  std::memcpy(u, b.scales, 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t mins_lo = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = mins_lo;
  u[0] &= kLow6;  // bytes 0..7 of u: scales of sub-blocks 0..7; bytes 8..15: mins
  const __m128i both = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
  const __m512i scales16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(both));
  const __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(both, 8));
  out.mins = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi16(mins16, mins16)),
                                     _mm_unpackhi_epi16(mins16, mins16), 1);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * k));
    out.q[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(raw, low4)),
                                  _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), 1);
    if constexpr (std::is_same_v<Block, BlockQ5_K>) {
      // Fifth bits: element 32j + l (sub-blocks j = 2k, 2k + 1 here) has bit j of qh[l].
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
      const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * k))),
                                             _mm256_set1_epi8(static_cast<char>(2 << (2 * k))), 1);
      out.q[k] = _mm512_or_si512(out.q[k],
                                 _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh, bit), _mm512_set1_epi8(0x10)));
    }
    out.scale[k] = _mm512_permutexvar_epi16(scale_idx[k], scales16);
  }
  out.d = f16(b.d);
  out.dmin = f16(b.dmin);
}

template <class Block, int T>
void q45k_rows(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, float* y,
               int64_t y_stride) {
  const int64_t nb = w.cols / kQK_K;
  __m512i scale_idx[4];
  for (int k = 0; k < 4; ++k) scale_idx[k] = lane_index(2 * k, 16);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blocks = reinterpret_cast<const Block*>(w.data + r * w.row_bytes);
    float acc[T] = {}, mins[T] = {};
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(&blocks[b]);
      Q4KDecoded dec;
      decode_q45k(blocks[b], scale_idx, dec);
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = a.q + (t0 + t) * a.q_stride + b * kQK_K;
        __m512i isum = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          const __m512i p = _mm512_maddubs_epi16(dec.q[k], _mm512_load_si512(xq + 64 * k));
          isum = _mm512_dpwssd_epi32(isum, p, dec.scale[k]);
        }
        const __m256i bs =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums + (t0 + t) * a.bsum_stride + b * 16));
        const int min_sum = hsum_i32(_mm256_madd_epi16(bs, dec.mins));
        const float dx = a.d[(t0 + t) * a.d_stride + b];
        acc[t] = std::fma(dec.d * dx, static_cast<float>(hsum_i32(isum)), acc[t]);
        mins[t] = std::fma(dec.dmin * dx, static_cast<float>(min_sum), mins[t]);
      }
    }
    for (int t = 0; t < T; ++t) y[t * y_stride + r] = acc[t] - mins[t];
  }
}

template <int T>
void q6k_rows(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, float* y, int64_t y_stride) {
  const int64_t nb = w.cols / kQK_K;
  __m512i scale_idx[4];
  for (int k = 0; k < 4; ++k) scale_idx[k] = lane_index(4 * k, 8);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blocks = reinterpret_cast<const BlockQ6_K*>(w.data + r * w.row_bytes);
    float acc[T] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ6_K& blk = blocks[b];
      prefetch_ahead(&blk);
      // Quants as unsigned 0..63 (the −32 offset is applied through the bsums), 64 per register in element order.
      __m512i q[4];
      for (int h = 0; h < 2; ++h) {
        const __m256i la = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * h));
        const __m256i lb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h));
        const __m256i q1 =
            _mm256_or_si256(_mm256_and_si256(la, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45));
        const __m256i q2 =
            _mm256_or_si256(_mm256_and_si256(lb, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45));
        const __m256i q3 =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), low4), _mm256_and_si256(hb, bits45));
        const __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), low4),
                                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45));
        q[2 * h] = _mm512_inserti64x4(_mm512_castsi256_si512(q1), q2, 1);
        q[2 * h + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(q3), q4, 1);
      }
      const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
      __m512i scale[4];
      for (int k = 0; k < 4; ++k) scale[k] = _mm512_permutexvar_epi16(scale_idx[k], _mm512_castsi256_si512(scales16));
      const float d = f16(blk.d);
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = a.q + (t0 + t) * a.q_stride + b * kQK_K;
        __m512i isum = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q[k], _mm512_load_si512(xq + 64 * k)), scale[k]);
        }
        const __m256i bs =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums + (t0 + t) * a.bsum_stride + b * 16));
        const int offset = 32 * hsum_i32(_mm256_madd_epi16(bs, scales16));
        const float dx = a.d[(t0 + t) * a.d_stride + b];
        acc[t] = std::fma(d * dx, static_cast<float>(hsum_i32(isum) - offset), acc[t]);
      }
    }
    for (int t = 0; t < T; ++t) y[t * y_stride + r] = acc[t];
  }
}

template <int T>
struct Q4KRows {
  static void run(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, float* y, int64_t ys) {
    q45k_rows<BlockQ4_K, T>(w, a, r0, r1, t0, y, ys);
  }
};
template <int T>
struct Q5KRows {
  static void run(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, float* y, int64_t ys) {
    q45k_rows<BlockQ5_K, T>(w, a, r0, r1, t0, y, ys);
  }
};
template <int T>
struct Q6KRows {
  static void run(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, float* y, int64_t ys) {
    q6k_rows<T>(w, a, r0, r1, t0, y, ys);
  }
};

template <template <int> class Rows>
void k_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
             int64_t y_stride) {
  // Rows in blocks of 16 so a block's weights stay in L1 while every 4-token tile passes over them.
  for (int64_t g = r0; g < r1; g += 16) {
    const int64_t g1 = imin(r1, g + 16);
    for (int64_t t = t0; t < t1; t += kTokens) {
      float* yt = y + t * y_stride;
      switch (imin(kTokens, t1 - t)) {
        case 1:
          Rows<1>::run(w, a, g, g1, t, yt, y_stride);
          break;
        case 2:
          Rows<2>::run(w, a, g, g1, t, yt, y_stride);
          break;
        case 3:
          Rows<3>::run(w, a, g, g1, t, yt, y_stride);
          break;
        default:
          Rows<4>::run(w, a, g, g1, t, yt, y_stride);
          break;
      }
    }
  }
}

}  // namespace

RangeKernel avx512_k_kernel_for(DType type) {
  switch (type) {
    case DType::kQ4_K:
      return k_range<Q4KRows>;
    case DType::kQ5_K:
      return k_range<Q5KRows>;
    case DType::kQ6_K:
      return k_range<Q6KRows>;
    default:
      return nullptr;
  }
}

}  // namespace servetune::cpu::detail
