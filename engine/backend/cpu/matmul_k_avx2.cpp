// AVX2 k-quant kernels (Q4_K, Q5_K, Q6_K weights × Q8_K activations) and the Q8_K activation quantizer. Whole
// 16-token groups go to the token-lane GEMM (matmul_k_tl_avx2.cpp); the other tokens (decode) to row octets: each
// row's super-block is decoded once per pass of up to four tokens, its vpmaddubsw pair sums widened by vpmaddwd with
// the sub-block scales into eight exact partial sums, and eight rows' partials are reduced by a tree of horizontal
// adds into one vector of exact integer sums, so a super-block costs one fma (and one for the mins) per row octet and
// token: the canonical arithmetic of matmul_k_reference.cpp.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_avx2.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/matmul_k_simd.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx2;
using kquant::Decoded;
using kquant::Traits;

constexpr int kOctet = 8;          // rows per tile: one vector lane each after the reduction
constexpr int kMaxTileTokens = 4;  // tokens per pass (a super-block is decoded once per pass)

// Lane i of the result: the sum of v[i]'s eight lanes (exact integer adds).
inline __m256i reduce_octet(const __m256i* v) {
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// Rows [r, r + n_rows) (n_rows <= 8) × tokens [t0, t0 + T). Short octets repeat their last row (not stored).
template <DType kType, int T>
void k_octet_tile(const Weights& w, const Activations& a, int64_t r, int n_rows, int64_t t0, float* y,
                  int64_t y_stride) {
  using Tr = Traits<kType>;
  using Block = typename Tr::Block;
  const int64_t nb = w.cols / kQK_K;
  const Block* rows[kOctet];
  for (int i = 0; i < kOctet; ++i) {
    rows[i] = reinterpret_cast<const Block*>(w.data + (r + (i < n_rows ? i : n_rows - 1)) * w.row_bytes);
  }
  // The rows are contiguous: the stream ahead of the octet, a few lines per super-block.
  const char* ahead = reinterpret_cast<const char*>(rows[0]) + kPrefetchAhead;
  const int64_t lines = (kOctet * w.row_bytes / 64 + nb - 1) / nb;
  __m256 acc[T], mins[T];
  for (int t = 0; t < T; ++t) acc[t] = mins[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < lines; ++j) _mm_prefetch(ahead + (b * lines + j) * 64, _MM_HINT_T0);
    alignas(32) int32_t isums[T][kOctet][8];  // per token and row: eight partial sums
    alignas(32) int32_t msums[Tr::kHasMin ? T : 1][kOctet][8];
    alignas(32) float dw[kOctet], dmw[kOctet];
    for (int i = 0; i < kOctet; ++i) {
      Decoded dec;
      kquant::decode<kType>(rows[i][b], dec);
      __m256i scale[8];
      kquant::pair_scales(dec.scales, scale);
      dw[i] = dec.d;
      dmw[i] = dec.dmin;
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = a.q + (t0 + t) * a.q_stride + b * kQK_K;
        __m256i isum = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) {
          const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + 32 * k));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(dec.codes[k], x), scale[k]));
        }
        const __m256i bsums =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums + (t0 + t) * a.bsum_stride + b * 16));
        const __m256i bterm = _mm256_madd_epi16(bsums, dec.coefs);
        if constexpr (Tr::kHasMin) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(msums[t][i]), bterm);
        } else {  // Q6_K: codes − 32
          isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bterm, 5));
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(isums[t][i]), isum);
      }
    }
    const __m256 d = _mm256_load_ps(dw);
    [[maybe_unused]] const __m256 dmin = _mm256_load_ps(dmw);
    for (int t = 0; t < T; ++t) {
      __m256i v[kOctet];
      for (int i = 0; i < kOctet; ++i) v[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(isums[t][i]));
      const __m256 dx = _mm256_set1_ps(a.d[(t0 + t) * a.d_stride + b]);
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(reduce_octet(v)), acc[t]);
      if constexpr (Tr::kHasMin) {
        for (int i = 0; i < kOctet; ++i) v[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(msums[t][i]));
        mins[t] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(reduce_octet(v)), mins[t]);
      }
    }
  }
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int t = 0; t < T; ++t) {
    const __m256 v = Tr::kHasMin ? _mm256_sub_ps(acc[t], mins[t]) : acc[t];
    float* out = y + (t0 + t) * y_stride + r;
    if (n_rows == kOctet) {
      _mm256_storeu_ps(out, v);
    } else {
      _mm256_maskstore_ps(out, keep, v);
    }
  }
}

// Whole 16-token groups go to the token-lane GEMM (t0 is a multiple of kTokenGroup); the other tokens to row octets,
// up to four tokens per pass.
template <DType kType>
void k_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
             int64_t y_stride) {
  const int64_t group0 = t0 / kTokenGroup, group1 = imin(t1 / kTokenGroup, a.n_groups);
  if (a.xp != nullptr && group1 > group0) {
    avx2_k_tl_range(w, a, r0, r1, group0, group1, y, y_stride);
    t0 = group1 * kTokenGroup;
    if (t0 >= t1) return;
  }
  for (int64_t t = t0; t < t1; t += kMaxTileTokens) {
    const int64_t n = imin(kMaxTileTokens, t1 - t);
    for (int64_t r = r0; r < r1; r += kOctet) {
      const int rows = static_cast<int>(imin(kOctet, r1 - r));
      switch (n) {
        case 1:
          k_octet_tile<kType, 1>(w, a, r, rows, t, y, y_stride);
          break;
        case 2:
          k_octet_tile<kType, 2>(w, a, r, rows, t, y, y_stride);
          break;
        case 3:
          k_octet_tile<kType, 3>(w, a, r, rows, t, y, y_stride);
          break;
        default:
          k_octet_tile<kType, 4>(w, a, r, rows, t, y, y_stride);
      }
    }
  }
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

// The AVX-512 quantizer's arithmetic eight lanes at a time: equal to quantize_q8k_reference bit for bit.
void avx2_quantize_q8k(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                       int64_t q_stride, float* d, int64_t d_stride, int16_t* bsums, int64_t bsum_stride) {
  const int64_t nb = cols / kQK_K;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    int8_t* qt = q + t * q_stride;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xt + b * kQK_K;
      __m256 amax_v = _mm256_setzero_ps();
      for (int i = 0; i < 32; ++i) amax_v = _mm256_max_ps(amax_v, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * i)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax_v), _mm256_extractf128_ps(amax_v, 1));
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
      for (int i = 0; i < 32; ++i) {
        const int hit = _mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * i)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
        if (hit != 0) {
          max = xb[8 * i + __builtin_ctz(static_cast<unsigned>(hit))];
          break;
        }
      }
      const float iscale = -127.0f / max;
      const __m256 scale = _mm256_set1_ps(iscale);
      for (int i = 0; i < 16; ++i) {
        __m256i qi[2];
        for (int h = 0; h < 2; ++h) {
          const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 16 * i + 8 * h), scale),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          qi[h] = _mm256_cvtps_epi32(_mm256_min_ps(v, _mm256_set1_ps(127.0f)));
        }
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[0], qi[1]), _MM_SHUFFLE(3, 1, 2, 0));
        const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + b * kQK_K + 16 * i), bytes);
        bs[i] = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(qi[0], qi[1])));
      }
      d[t * d_stride + b] = 1.0f / iscale;
    }
    std::memset(qt + cols, 0, static_cast<size_t>(q_stride - cols));
    for (int64_t b = nb; b < d_stride; ++b) d[t * d_stride + b] = 0.0f;
    for (int64_t j = nb * 16; j < bsum_stride; ++j) bsums[t * bsum_stride + j] = 0;
  }
}

RangeKernel avx2_k_kernel_for(DType type) {
  switch (type) {
    case DType::kQ4_K:
      return k_range<DType::kQ4_K>;
    case DType::kQ5_K:
      return k_range<DType::kQ5_K>;
    case DType::kQ6_K:
      return k_range<DType::kQ6_K>;
    default:
      return nullptr;
  }
}

}  // namespace servetune::cpu::detail
