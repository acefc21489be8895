// Token-lane AVX2 GEMM for k-quant weights (Q4_K, Q5_K, Q6_K; prefill and batched decode, groups of 16 tokens): as
// matmul_tl_avx2.cpp, one vpmaddubsw multiplies a broadcast weight quad by 8 tokens' activation quads and the 16-bit
// pair sums of a few quads add up in place; the vpmaddwd that widens them multiplies by the sub-block scale, so a
// super-block's exact integer sums come out in token lanes at the cost of the legacy types' block sums. One fma per
// super-block, row and token follows (and one for the mins), the canonical arithmetic of matmul_k_reference.cpp.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_avx2.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/matmul_k_simd.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx2;
using kquant::Traits;

constexpr int64_t kRowsPerPanel = 16;
constexpr int kRows = 2;  // register tile: 2 rows × 16 tokens (two 8-token halves)

// Up to 16 rows decoded, per row and super-block: 256 codes (kquant::Decoded's form), the scale of each 16-element
// sub-block twice in a dword (the vpmaddwd multiplier of its pair sums), the bsum coefficients in pairs, d and dmin.
struct KPanel {
  uint8_t* q;
  int32_t* scales;  // 16 per super-block
  int32_t* coefs;   // 8 per super-block
  float* d;
  float* dmin;
  int64_t nb;
};

template <DType kType>
void decode_row(const uint8_t* row, const KPanel& p, int64_t r) {
  const auto* blocks = reinterpret_cast<const typename Traits<kType>::Block*>(row);
  for (int64_t b = 0; b < p.nb; ++b) {
    _mm_prefetch(reinterpret_cast<const char*>(blocks + b) + kPrefetchAhead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blocks + b) + kPrefetchAhead + 64, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blocks + b) + kPrefetchAhead + 128, _MM_HINT_T0);
    kquant::Decoded dec;
    kquant::decode<kType>(blocks[b], dec);
    const int64_t at = r * p.nb + b;
    for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(p.q + at * 256 + 32 * k), dec.codes[k]);
    // unpack within 128-bit lanes: dwords of sub-blocks 0-3, 8-11, then 4-7, 12-15.
    const __m256i lo = _mm256_unpacklo_epi16(dec.scales, dec.scales), hi = _mm256_unpackhi_epi16(dec.scales, dec.scales);
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.scales + at * 16), _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.scales + at * 16 + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.coefs + at * 8), dec.coefs);
    p.d[at] = dec.d;
    p.dmin[at] = dec.dmin;
  }
}

inline __m256i broadcast_quad(const uint8_t* p) {
  int32_t quad;
  std::memcpy(&quad, p, 4);
  return _mm256_set1_epi32(quad);
}

// Σ_p coef pair p · bsum pair p of the 8 tokens at `bst` (pair-major, 16 tokens per pair), exact.
inline __m256i bsum_term(const int32_t* coefs, const int32_t* bst) {
  __m256i sum = _mm256_setzero_si256();
  for (int p = 0; p < 8; ++p) {
    const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(bst + p * 16));
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(b, _mm256_set1_epi32(coefs[p])));
  }
  return sum;
}

// Panel rows [r, r + R) × the 16 tokens of `group`: out[row * 16 + token].
template <DType kType, int R>
void k_tl_tile(const KPanel& p, int64_t r, const Activations& a, int64_t group, float* out) {
  using Tr = Traits<kType>;
  constexpr int kQuads = Tr::kQuadsPerWiden;
  constexpr int kSubQuads = Tr::kSubBlock / 4;
  const int64_t nb = p.nb;
  const int8_t* xp = a.xp + group * a.q_stride * 16;
  const float* dt = a.dt + group * a.d_stride * 16;
  const int32_t* bst = a.bst + group * (a.bsum_stride / 2) * 16;
  __m256 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    background_prefetch_step(a.background);
    __m256i isum[R][2];
    for (int i = 0; i < R; ++i) {
      for (int h = 0; h < 2; ++h) {
        isum[i][h] = _mm256_setzero_si256();
        if constexpr (!Tr::kHasMin) {  // Q6_K: codes − 32, the correction as the sums' start
          const __m256i bterm = bsum_term(p.coefs + ((r + i) * nb + b) * 8, bst + b * 8 * 16 + h * 8);
          isum[i][h] = _mm256_sub_epi32(isum[i][h], _mm256_slli_epi32(bterm, 5));
        }
      }
    }
    for (int k0 = 0; k0 < 64; k0 += kQuads) {
      __m256i pairs[R][2];
      for (int i = 0; i < R; ++i) pairs[i][0] = pairs[i][1] = _mm256_setzero_si256();
      for (int k = k0; k < k0 + kQuads; ++k) {
        const int8_t* xk = xp + (b * 64 + k) * 64;
        const __m256i xv[2] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(xk)),
                               _mm256_load_si256(reinterpret_cast<const __m256i*>(xk + 32))};
        for (int i = 0; i < R; ++i) {
          const __m256i wq = broadcast_quad(p.q + ((r + i) * nb + b) * 256 + 4 * k);
          for (int h = 0; h < 2; ++h) {
            pairs[i][h] = _mm256_add_epi16(pairs[i][h], _mm256_maddubs_epi16(wq, xv[h]));
            keep_in_register(pairs[i][h]);
          }
        }
      }
      // Quads k0 .. k0 + kQuads lie in one sub-block: its scale widens their pair sums.
      const int sub16 = k0 / kSubQuads * (Tr::kSubBlock / 16);
      for (int i = 0; i < R; ++i) {
        const __m256i scale = _mm256_set1_epi32(p.scales[((r + i) * nb + b) * 16 + sub16]);
        for (int h = 0; h < 2; ++h) isum[i][h] = _mm256_add_epi32(isum[i][h], _mm256_madd_epi16(pairs[i][h], scale));
      }
    }
    const __m256 dx[2] = {_mm256_load_ps(dt + b * 16), _mm256_load_ps(dt + b * 16 + 8)};
    for (int i = 0; i < R; ++i) {
      const __m256 dw = _mm256_set1_ps(p.d[(r + i) * nb + b]);
      for (int h = 0; h < 2; ++h) {
        acc[i][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[h]), _mm256_cvtepi32_ps(isum[i][h]), acc[i][h]);
      }
    }
  }
  if constexpr (Tr::kHasMin) {
    // Σ min·bsum, its own chain as in the reference, subtracted at the end.
    __m256 mins[R][2];
    for (int i = 0; i < R; ++i) mins[i][0] = mins[i][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256 dx[2] = {_mm256_load_ps(dt + b * 16), _mm256_load_ps(dt + b * 16 + 8)};
      for (int i = 0; i < R; ++i) {
        const __m256 dm = _mm256_set1_ps(p.dmin[(r + i) * nb + b]);
        for (int h = 0; h < 2; ++h) {
          const __m256i msum = bsum_term(p.coefs + ((r + i) * nb + b) * 8, bst + b * 8 * 16 + h * 8);
          mins[i][h] = _mm256_fmadd_ps(_mm256_mul_ps(dm, dx[h]), _mm256_cvtepi32_ps(msum), mins[i][h]);
        }
      }
    }
    for (int i = 0; i < R; ++i) {
      for (int h = 0; h < 2; ++h) acc[i][h] = _mm256_sub_ps(acc[i][h], mins[i][h]);
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int h = 0; h < 2; ++h) _mm256_store_ps(out + (r + i) * 16 + h * 8, acc[i][h]);
  }
}

// Transposes an 8×8 matrix of 32-bit elements held in 8 registers (row i in v[i]).
inline void transpose8(__m256* v) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

template <DType kType>
void k_tl_range_impl(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                     int64_t y_stride) {
  const int64_t nb = w.cols / kQK_K;
  const int64_t per_row = nb * (256 + 16 * 4 + 8 * 4 + 2 * 4);
  auto* base = static_cast<uint8_t*>(thread_scratch(ScratchSlot::kTokenLanePanel, static_cast<size_t>(kRowsPerPanel * per_row)));
  KPanel p;
  p.nb = nb;
  p.q = base;
  p.scales = reinterpret_cast<int32_t*>(base + kRowsPerPanel * nb * 256);
  p.coefs = p.scales + kRowsPerPanel * nb * 16;
  p.d = reinterpret_cast<float*>(p.coefs + kRowsPerPanel * nb * 8);
  p.dmin = p.d + kRowsPerPanel * nb;
  for (int64_t rp = r0; rp < r1; rp += kRowsPerPanel) {
    const int64_t rows = imin(kRowsPerPanel, r1 - rp);
    for (int64_t i = 0; i < rows; ++i) decode_row<kType>(w.data + (rp + i) * w.row_bytes, p, i);
    // The next panel's rows are fetched into L2 while this one's tiles compute.
    const int64_t next_rows = imin(kRowsPerPanel, r1 - rp - kRowsPerPanel);
    const char* next = reinterpret_cast<const char*>(w.data + (rp + kRowsPerPanel) * w.row_bytes);
    for (int64_t off = 0; off < next_rows * w.row_bytes; off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
    for (int64_t g = g0; g < g1; ++g) {
      alignas(32) float out[kRowsPerPanel * 16];  // [panel row][token]
      int64_t i = 0;
      for (; i + kRows <= rows; i += kRows) k_tl_tile<kType, kRows>(p, i, a, g, out);
      if (i < rows) k_tl_tile<kType, 1>(p, i, a, g, out);
      for (int64_t rb = 0; rb < rows; rb += 8) {
        const int64_t n = imin(8, rows - rb);
        for (int h = 0; h < 2; ++h) {
          __m256 v[8];
          for (int k = 0; k < 8; ++k) v[k] = k < n ? _mm256_load_ps(out + (rb + k) * 16 + h * 8) : _mm256_setzero_ps();
          transpose8(v);  // v[t]: token h * 8 + t's rows rb .. rb + 7
          float* yt = y + (g * 16 + h * 8) * y_stride + rp + rb;
          if (n == 8) {
            for (int t = 0; t < 8; ++t) _mm256_storeu_ps(yt + t * y_stride, v[t]);
          } else {
            const __m256i keep =
                _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            for (int t = 0; t < 8; ++t) _mm256_maskstore_ps(yt + t * y_stride, keep, v[t]);
          }
        }
      }
    }
  }
}

}  // namespace

void avx2_k_tl_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                     int64_t y_stride) {
  switch (w.type) {
    case DType::kQ4_K:
      return k_tl_range_impl<DType::kQ4_K>(w, a, r0, r1, g0, g1, y, y_stride);
    case DType::kQ5_K:
      return k_tl_range_impl<DType::kQ5_K>(w, a, r0, r1, g0, g1, y, y_stride);
    default:
      return k_tl_range_impl<DType::kQ6_K>(w, a, r0, r1, g0, g1, y, y_stride);
  }
}

}  // namespace servetune::cpu::detail
