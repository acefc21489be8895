// Token-lane AVX2 GEMM for prefill and batched decode (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights, groups of 16
// tokens): one vpmaddubsw multiplies a broadcast weight quad by 8 tokens' activation quads, so the sums stay in token
// lanes and no horizontal reduction is needed. 4- and 5-bit codes (u8, offset form) keep their pair sums in 16 bits
// for several quads before one vpmaddwd widens them; Q8_0 uses the |w|, sign(x, w) trick and widens every quad. Each
// block's exact integer sums then take one fma per row and token, the canonical arithmetic of matmul_reference.cpp.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_avx2.h"
#include "backend/cpu/matmul_internal.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx2;

constexpr int64_t kRowsPerPanel = 16;
constexpr int kRows = 2;  // register tile: 2 rows × 16 tokens (two 8-token halves)

// Quads whose vpmaddubsw pair sums can add up in 16-bit lanes without overflow (|x| <= 127): 8 for 4-bit codes
// (8 · 2 · 15 · 127 = 30,480), 4 for 5-bit ones (4 · 2 · 31 · 127 = 31,496); Q8_0's (up to 2 · 128 · 127) widen at
// once.
template <DType kType>
constexpr int kQuadsPerWiden = kType == DType::kQ8_0                            ? 1
                               : kType == DType::kQ5_0 || kType == DType::kQ5_1 ? 4
                                                                                : 8;

// Up to 16 rows decoded: per row nb blocks of 32 codes (block_codes' form) and, for Q8_0, their absolute values; f32 d
// and (Q4_1, Q5_1) m per block.
struct Panel {
  uint8_t* q;
  uint8_t* qa;
  float* d;
  float* m;
  int64_t nb;
};

template <DType kType>
void decode_row(const uint8_t* row, const Panel& p, int64_t r) {
  for (int64_t b = 0; b < p.nb; ++b) {
    const auto* blk = reinterpret_cast<const BlockOf<kType>*>(row) + b;
    _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchAhead, _MM_HINT_T0);
    const __m256i codes = block_codes<kType>(blk);
    const int64_t at = (r * p.nb + b) * 32;
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.q + at), codes);
    if constexpr (kType == DType::kQ8_0) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(p.qa + at), _mm256_sign_epi8(codes, codes));
    }
    p.d[r * p.nb + b] = _cvtsh_ss(blk->d);
    if constexpr (kHasMin<kType>) p.m[r * p.nb + b] = _cvtsh_ss(blk->m);
  }
}

inline __m256i broadcast_quad(const uint8_t* p) {
  int32_t quad;
  std::memcpy(&quad, p, 4);
  return _mm256_set1_epi32(quad);
}

// Panel rows [r, r + R) × the 16 tokens of `group`: out[row * 16 + token].
template <DType kType, int R>
void tl_tile(const Panel& p, int64_t r, const Activations& a, int64_t group, float* out) {
  constexpr int kShift = kOffsetShift<kType>;
  constexpr int kQuads = kQuadsPerWiden<kType>;
  const int64_t nb = p.nb;
  const int8_t* xp = a.xp + group * a.q_stride * 16;
  const float* dt = a.dt + group * a.d_stride * 16;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    background_prefetch_step(a.background);
    // Offset codes: Σ (w + offset)·x − offset·Σx, the correction as the sums' start.
    __m256i isum[R][2];
    for (int h = 0; h < 2; ++h) {
      __m256i init = _mm256_setzero_si256();
      if constexpr (kShift >= 0) {
        const int32_t* nxs = a.nxs + group * a.d_stride * 16 + b * 16 + h * 8;
        init = _mm256_slli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(nxs)), kShift);
      }
      for (int i = 0; i < R; ++i) isum[i][h] = init;
    }
    for (int k0 = 0; k0 < 8; k0 += kQuads) {
      [[maybe_unused]] __m256i pairs[R][2];  // 16-bit pair sums (not Q8_0)
      for (int i = 0; i < R; ++i) pairs[i][0] = pairs[i][1] = _mm256_setzero_si256();
      for (int k = k0; k < k0 + kQuads; ++k) {
        const int8_t* xk = xp + (b * 8 + k) * 64;
        const __m256i xv[2] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(xk)),
                               _mm256_load_si256(reinterpret_cast<const __m256i*>(xk + 32))};
        for (int i = 0; i < R; ++i) {
          const int64_t at = ((r + i) * nb + b) * 32 + 4 * k;
          const __m256i wq = broadcast_quad(p.q + at);
          if constexpr (kType == DType::kQ8_0) {
            const __m256i aw = broadcast_quad(p.qa + at);
            for (int h = 0; h < 2; ++h) {
              const __m256i prod = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[h], wq));
              isum[i][h] = _mm256_add_epi32(isum[i][h], _mm256_madd_epi16(prod, ones));
            }
          } else {
            for (int h = 0; h < 2; ++h) {
              pairs[i][h] = _mm256_add_epi16(pairs[i][h], _mm256_maddubs_epi16(wq, xv[h]));
              keep_in_register(pairs[i][h]);
            }
          }
        }
      }
      if constexpr (kType != DType::kQ8_0) {
        for (int i = 0; i < R; ++i) {
          for (int h = 0; h < 2; ++h) isum[i][h] = _mm256_add_epi32(isum[i][h], _mm256_madd_epi16(pairs[i][h], ones));
        }
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
  if constexpr (kHasMin<kType>) {
    // Σ m·s, its own chain as in the reference, added at the end.
    const float* st = a.st + group * a.d_stride * 16;
    __m256 mins[R][2];
    for (int i = 0; i < R; ++i) mins[i][0] = mins[i][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256 sx[2] = {_mm256_load_ps(st + b * 16), _mm256_load_ps(st + b * 16 + 8)};
      for (int i = 0; i < R; ++i) {
        const __m256 mw = _mm256_set1_ps(p.m[(r + i) * nb + b]);
        for (int h = 0; h < 2; ++h) mins[i][h] = _mm256_fmadd_ps(mw, sx[h], mins[i][h]);
      }
    }
    for (int i = 0; i < R; ++i) {
      for (int h = 0; h < 2; ++h) acc[i][h] = _mm256_add_ps(acc[i][h], mins[i][h]);
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
void tl_range_impl(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                   int64_t y_stride) {
  const int64_t nb = a.nb;
  const int64_t code_bytes = kRowsPerPanel * nb * 32;
  const int64_t bytes = code_bytes * (kType == DType::kQ8_0 ? 2 : 1) + 2 * kRowsPerPanel * nb * 4;
  auto* base = static_cast<uint8_t*>(thread_scratch(ScratchSlot::kTokenLanePanel, static_cast<size_t>(bytes)));
  Panel p;
  p.nb = nb;
  p.q = base;
  p.qa = kType == DType::kQ8_0 ? base + code_bytes : nullptr;
  p.d = reinterpret_cast<float*>(base + code_bytes * (kType == DType::kQ8_0 ? 2 : 1));
  p.m = p.d + kRowsPerPanel * nb;
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
      for (; i + kRows <= rows; i += kRows) tl_tile<kType, kRows>(p, i, a, g, out);
      if (i < rows) tl_tile<kType, 1>(p, i, a, g, out);
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

void avx2_pack_token_groups(const Activations& a, int64_t g0, int64_t g1, int8_t* xp, float* dt, float* st,
                            int32_t* nxs, int32_t* bst) {
  const int64_t xp_stride = a.q_stride * 16;
  const int64_t dt_stride = a.d_stride * 16;
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 v[8];
  for (int64_t g = g0; g < g1; ++g) {
    for (int h = 0; h < 2; ++h) {
      const int64_t t0 = g * 16 + h * 8;
      // Activation quads: 8 tokens × 8 quads (one block) per step → 8 quads × 8 tokens; with each block's negated
      // sums when offset codes need the correction.
      for (int64_t c = 0; c < a.q_stride; c += 32) {
        for (int t = 0; t < 8; ++t)
          v[t] = _mm256_load_ps(reinterpret_cast<const float*>(a.q + (t0 + t) * a.q_stride + c));
        transpose8(v);
        __m256i pairs = _mm256_setzero_si256();
        for (int i = 0; i < 8; ++i) {
          const __m256i quads = _mm256_castps_si256(v[i]);
          _mm256_store_si256(reinterpret_cast<__m256i*>(xp + g * xp_stride + (c / 4 + i) * 64 + h * 32), quads);
          pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(ones8, quads));
        }
        if (nxs != nullptr) {
          const __m256i sum = _mm256_madd_epi16(pairs, ones16);
          _mm256_store_si256(reinterpret_cast<__m256i*>(nxs + g * dt_stride + (c / 32) * 16 + h * 8),
                             _mm256_sub_epi32(_mm256_setzero_si256(), sum));
        }
      }
      // Scales (and Q8_1 sums): 8 tokens × 8 blocks → 8 blocks × 8 tokens.
      for (int pass = 0; pass < (a.s != nullptr ? 2 : 1); ++pass) {
        const float* src = pass == 0 ? a.d : a.s;
        float* dst = pass == 0 ? dt : st;
        for (int64_t c = 0; c < a.d_stride; c += 8) {
          for (int t = 0; t < 8; ++t) v[t] = _mm256_load_ps(src + (t0 + t) * a.d_stride + c);
          transpose8(v);
          for (int i = 0; i < 8; ++i) _mm256_store_ps(dst + g * dt_stride + (c + i) * 16 + h * 8, v[i]);
        }
      }
      // Q8_K bsums, a pair per dword: 8 tokens × 8 pairs → 8 pairs × 8 tokens.
      if (bst == nullptr) continue;
      const int64_t pairs = a.bsum_stride / 2;
      const auto* src = reinterpret_cast<const float*>(a.bsums);
      for (int64_t c = 0; c < pairs; c += 8) {
        for (int t = 0; t < 8; ++t) v[t] = _mm256_load_ps(src + (t0 + t) * pairs + c);
        transpose8(v);
        for (int i = 0; i < 8; ++i) {
          _mm256_store_ps(reinterpret_cast<float*>(bst) + g * pairs * 16 + (c + i) * 16 + h * 8, v[i]);
        }
      }
    }
  }
}

void avx2_tl_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                   int64_t y_stride) {
  switch (w.type) {
    case DType::kQ4_0:
      return tl_range_impl<DType::kQ4_0>(w, a, r0, r1, g0, g1, y, y_stride);
    case DType::kQ4_1:
      return tl_range_impl<DType::kQ4_1>(w, a, r0, r1, g0, g1, y, y_stride);
    case DType::kQ5_0:
      return tl_range_impl<DType::kQ5_0>(w, a, r0, r1, g0, g1, y, y_stride);
    case DType::kQ5_1:
      return tl_range_impl<DType::kQ5_1>(w, a, r0, r1, g0, g1, y, y_stride);
    default:
      return tl_range_impl<DType::kQ8_0>(w, a, r0, r1, g0, g1, y, y_stride);
  }
}

}  // namespace servetune::cpu::detail
