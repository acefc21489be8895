// AVX2 kernels for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights × Q8 activations, plus the activation quantizer (ggml's
// x86 scheme). Whole 16-token groups go to the token-lane GEMM (matmul_tl_avx2.cpp); the other tokens (decode of one
// to 15 sequences) to row octets: eight rows read in place, one per vector lane, their vpmaddubsw block dots (signed
// Q8_0 weights through the |w|, sign(x, w) trick, so 16-bit pair sums cannot saturate) reduced across the rows by a
// tree of horizontal adds into one vector of exact integer sums, then one fma per block and token, the canonical
// arithmetic of matmul_reference.cpp.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_avx2.h"
#include "backend/cpu/matmul_internal.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx2;

inline float f16_round_trip(float v) { return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)); }

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

void quantize_q8(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q, int64_t q_stride,
                 float* d, float* s, int64_t d_stride) {
  const int64_t nb = cols / kQBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    int8_t* qt = q + t * q_stride;
    float* dt = d + t * d_stride;
    float* st = s != nullptr ? s + t * d_stride : nullptr;
    for (int64_t b = 0; b < nb; ++b) {
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xt + b * kQBlock + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float max_abs = _mm_cvtss_f32(m4);
      const float dd = max_abs / 127.0f;
      const __m256 id = _mm256_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
      __m256i iv[4];
      for (int i = 0; i < 4; ++i) {
        iv[i] =
            _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      const __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]);
      const __m256i p23 = _mm256_packs_epi32(iv[2], iv[3]);
      const __m256i packed =
          _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qt + b * kQBlock), packed);
      dt[b] = f16_round_trip(dd);
      if (st != nullptr) {
        const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3])));
        st[b] = f16_round_trip(dd * static_cast<float>(sum));
      }
    }
    std::memset(qt + cols, 0, static_cast<size_t>(q_stride - cols));
    for (int64_t b = nb; b < d_stride; ++b) {
      dt[b] = 0.0f;
      if (st != nullptr) st[b] = 0.0f;
    }
  }
}

constexpr int kOctet = 8;                 // rows per tile: one vector lane each
constexpr int kMaxTileTokens = 4;         // tokens per tile pass (the octet's codes are decoded once per pass)

// The eight rows' f16 d (and m) of the block at byte `off`, widened: one dword from each row's block head.
template <DType kType>
inline void octet_scales(const uint8_t* const* rows, int64_t off, __m256& d, __m256& m) {
  int32_t head[kOctet];
  for (int i = 0; i < kOctet; ++i) std::memcpy(&head[i], rows[i] + off, 4);
  const __m256i h = _mm256_setr_epi32(head[0], head[1], head[2], head[3], head[4], head[5], head[6], head[7]);
  // [d0..d3 m0..m3 | d4..d7 m4..m7] -> [d0..d7 | m0..m7]
  const __m256i packed = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(h, 16)),
      _MM_SHUFFLE(3, 1, 2, 0));
  d = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
  if constexpr (kHasMin<kType>) m = _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1));
}

// Lane i: the exact integer dot of code vector c[i] (block_codes' form; Q8_0: signed codes, a: their absolute values)
// with the activation block x. 4-bit codes sum their vpmaddubsw pairs in 16 bits through three levels of a row
// tree (16 · 15 · 127 = 30,480 per half block), 5-bit ones through two (8 · 31 · 127 = 31,496), Q8_0 widens at once.
template <DType kType>
inline __m256i octet_dots(const __m256i* c, const __m256i* a, __m256i x) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i p[kOctet];
  if constexpr (kType == DType::kQ8_0) {
    for (int i = 0; i < kOctet; ++i)
      p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(a[i], _mm256_sign_epi8(x, c[i])), ones);
    const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
  } else {
    for (int i = 0; i < kOctet; ++i) p[i] = _mm256_maddubs_epi16(c[i], x);
    // Each 128-bit half holds one half block (elements 0-15, 16-31); hadd keeps the halves apart.
    const __m256i q0 = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
    const __m256i q1 = _mm256_hadd_epi16(_mm256_hadd_epi16(p[4], p[5]), _mm256_hadd_epi16(p[6], p[7]));
    if constexpr (kType == DType::kQ5_0 || kType == DType::kQ5_1) {
      const __m256i m0 = _mm256_madd_epi16(q0, ones);  // [rows 0-3, first half | rows 0-3, second half]
      const __m256i m1 = _mm256_madd_epi16(q1, ones);
      return _mm256_add_epi32(_mm256_permute2x128_si256(m0, m1, 0x20), _mm256_permute2x128_si256(m0, m1, 0x31));
    } else {
      const __m256i r = _mm256_hadd_epi16(q0, q1);  // [rows 0-7, first half | rows 0-7, second half]
      return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(r)),
                              _mm256_cvtepi16_epi32(_mm256_extracti128_si256(r, 1)));
    }
  }
}

// Rows [r, r + n_rows) (n_rows <= 8) × tokens [t0, t0 + T): the eight rows read in place, one per vector lane, so a
// block's scales, fma and output are one vector per token.
template <DType kType, int T>
void octet_tile(const Weights& w, const Activations& a, int64_t r, int n_rows, int64_t t0, float* y, int64_t y_stride) {
  constexpr int64_t kBlockBytes = sizeof(BlockOf<kType>);
  const int64_t nb = a.nb;
  const uint8_t* rows[kOctet];
  for (int i = 0; i < kOctet; ++i) rows[i] = w.data + (r + (i < n_rows ? i : n_rows - 1)) * w.row_bytes;
  // The rows are contiguous: the stream ahead of the octet, a few lines per block step.
  const char* ahead = reinterpret_cast<const char*>(rows[0]) + kPrefetchAhead;
  const int64_t lines = (kOctet * w.row_bytes / 64 + nb - 1) / nb;
  __m256 acc[T], mins[T];
  for (int t = 0; t < T; ++t) acc[t] = mins[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < lines; ++j) _mm_prefetch(ahead + (b * lines + j) * 64, _MM_HINT_T0);
    const int64_t off = b * kBlockBytes;
    __m256i c[kOctet], abs_c[kOctet];
    for (int i = 0; i < kOctet; ++i) {
      c[i] = block_codes<kType>(reinterpret_cast<const BlockOf<kType>*>(rows[i] + off));
      if constexpr (kType == DType::kQ8_0) abs_c[i] = _mm256_sign_epi8(c[i], c[i]);
    }
    __m256 dw, mw;
    octet_scales<kType>(rows, off, dw, mw);
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = a.q + (t0 + t) * a.q_stride + b * kQBlock;
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
      __m256i isum = octet_dots<kType>(c, abs_c, x);
      if constexpr (kOffsetShift<kType> >= 0) {  // Σ (w + offset)·x − offset·Σx
        const __m256i xsum = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x), _mm256_set1_epi16(1));
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_set1_epi32(hsum_i32(xsum)), kOffsetShift<kType>));
      }
      const __m256 dx = _mm256_set1_ps(a.d[(t0 + t) * a.d_stride + b]);
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum), acc[t]);
      if constexpr (kHasMin<kType>) {
        mins[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s[(t0 + t) * a.d_stride + b]), mins[t]);
      }
    }
  }
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int t = 0; t < T; ++t) {
    const __m256 v = kHasMin<kType> ? _mm256_add_ps(acc[t], mins[t]) : acc[t];
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
void quant_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  const int64_t group0 = t0 / kTokenGroup, group1 = imin(t1 / kTokenGroup, a.n_groups);
  if (a.xp != nullptr && group1 > group0) {
    avx2_tl_range(w, a, r0, r1, group0, group1, y, y_stride);
    t0 = group1 * kTokenGroup;
    if (t0 >= t1) return;
  }
  for (int64_t t = t0; t < t1; t += kMaxTileTokens) {
    const int64_t n = imin(kMaxTileTokens, t1 - t);
    for (int64_t r = r0; r < r1; r += kOctet) {
      const int rows = static_cast<int>(imin(kOctet, r1 - r));
      switch (n) {
        case 1:
          octet_tile<kType, 1>(w, a, r, rows, t, y, y_stride);
          break;
        case 2:
          octet_tile<kType, 2>(w, a, r, rows, t, y, y_stride);
          break;
        case 3:
          octet_tile<kType, 3>(w, a, r, rows, t, y, y_stride);
          break;
        default:
          octet_tile<kType, 4>(w, a, r, rows, t, y, y_stride);
      }
    }
  }
}

RangeKernel kernel_for(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return quant_range<DType::kQ4_0>;
    case DType::kQ4_1:
      return quant_range<DType::kQ4_1>;
    case DType::kQ5_0:
      return quant_range<DType::kQ5_0>;
    case DType::kQ5_1:
      return quant_range<DType::kQ5_1>;
    case DType::kQ8_0:
      return quant_range<DType::kQ8_0>;
    case DType::kFP8_E4M3_B128:
      return avx2_fp8_block_range;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return avx2_k_kernel_for(type);
    default:
      return avx2_float_kernel_for(type);
  }
}

}  // namespace

const IsaKernels& avx2_kernels() {
  static const IsaKernels kernels{quantize_q8, avx2_quantize_q8k, avx2_round_f16, avx2_round_bf16,
                                  kernel_for,  avx2_pack_token_groups};
  return kernels;
}

}  // namespace servetune::cpu::detail
