// AVX-512 VNNI kernels for Q4_0 / Q4_1 / Q8_0 weights × Q8 activations, plus the activation quantizer.
// Weights-stationary: up to 16 rows are decoded once into an L1 panel (u8 quants, f32 scales) and reused for every
// token; a 4×4 (rows × tokens) register tile does one vpdpbusd per 64 bytes per (row, token).
// GCC 12 warns about the deliberately undefined vectors inside the AVX-512 intrinsic headers (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>
#include <cstdlib>

#include "backend/cpu/matmul_internal.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
int64_t g_pf_dist = 0;
namespace {

constexpr int64_t kChunkBlocks = 128;
  // K-chunk of one panel: 4096 columns
constexpr int64_t kGroupRows = 16;     // rows per panel
constexpr int64_t kPanelPairBytes = 64;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Horizontal reductions (GCC 12's _mm512_reduce_* trip -Wuninitialized inside the intrinsic headers).
inline __m512 fold_lanes_add(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
}
inline float hsum(__m512 v) {
  __m128 x = _mm512_castps512_ps128(fold_lanes_add(v));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
inline float hmax(__m512 v) {
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 x = _mm512_castps512_ps128(v);
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
inline int hsum_i32(__m512i v) {
  v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128i x = _mm512_castsi512_si128(v);
  x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(x);
}

inline float f16_round_trip(float v) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
}

void quantize_q8(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q, int64_t q_stride,
                 float* d, float* s, int64_t d_stride) {
  const int64_t nb = cols / kQBlock;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    int8_t* qt = q + t * q_stride;
    float* dt = d + t * d_stride;
    float* st = s != nullptr ? s + t * d_stride : nullptr;
    for (int64_t b = 0; b < nb; ++b) {
      const __m512 v0 = _mm512_loadu_ps(xt + b * kQBlock);
      const __m512 v1 = _mm512_loadu_ps(xt + b * kQBlock + 16);
      const float amax = hmax(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
      const float dd = amax / 127.0f;
      const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      const __m512i i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, id), kRound));
      const __m512i i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, id), kRound));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + b * kQBlock), _mm512_cvtsepi32_epi8(i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + b * kQBlock + 16), _mm512_cvtsepi32_epi8(i1));
      dt[b] = f16_round_trip(dd);
      if (st != nullptr) {
        const int sum = hsum_i32(_mm512_add_epi32(i0, i1));
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

// Decoded rows: per row, `pairs` × 64 bytes of u8 quants (block pairs, natural order; a missing odd block is zero),
// then per-block f32 scales d and (Q4_1) mins m, zero-padded to a multiple of 16 blocks.
struct Panel {
  uint8_t* q;
  float* d;
  float* m;
  int64_t q_stride;  // bytes per row
  int64_t d_stride;  // floats per row
};

template <DType kType>
struct QuantTraits;
template <>
struct QuantTraits<DType::kQ4_0> {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8;  // q_w = nibble − 8: the kernel subtracts 8·Σq_x
  static constexpr bool kHasMin = false;
};
template <>
struct QuantTraits<DType::kQ4_1> {
  using Block = BlockQ4_1;
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = true;
};
template <>
struct QuantTraits<DType::kQ8_0> {
  using Block = BlockQ8_0;
  static constexpr int kOffset = 128;  // stored as q_w + 128 so vpdpbusd sees unsigned weights
  static constexpr bool kHasMin = false;
};

// Quants of blocks b and b+1 as 64 u8 in natural element order (Q8_0: q + 128). With `single`, block b only and
// the upper 32 bytes zero.
template <DType kType>
inline __m512i unpack_pair(const typename QuantTraits<kType>::Block* blk, bool single) {
  if constexpr (kType == DType::kQ8_0) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[0].qs));
    const __m256i c = single ? _mm256_setzero_si256() : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[1].qs));
    const __m256i bias = _mm256_set1_epi8(-128);
    const __m256i hi = single ? c : _mm256_xor_si256(c, bias);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_xor_si256(a, bias)), hi, 1);
  } else {
    // [A, A, B, B] in 128-bit lanes, odd lanes shifted right by 4: [A lo, A hi, B lo, B hi] after the mask.
    const __m256i aa = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[0].qs)));
    const __m256i bb = single ? _mm256_setzero_si256()
                              : _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[1].qs)));
    const __m512i z = _mm512_srlv_epi64(_mm512_inserti64x4(_mm512_castsi256_si512(aa), bb, 1),
                                        _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
  }
}

template <DType kType>
void decode_row(const uint8_t* row, int64_t b0, int64_t nbc, const Panel& p, int64_t r) {
  using Block = typename QuantTraits<kType>::Block;
  const auto* blocks = reinterpret_cast<const Block*>(row) + b0;
  uint8_t* out = p.q + r * p.q_stride;
  int64_t b = 0;
  for (; b + 1 < nbc; b += 2) _mm512_store_si512(out + b * 32, unpack_pair<kType>(blocks + b, false));
  if (b < nbc) _mm512_store_si512(out + b * 32, unpack_pair<kType>(blocks + b, true));
  // Scales (and mins): the first dword of each block holds d (and m for Q4_1) as f16. Gather 16 blocks' dwords
  // with inserts (no store-to-load round trip), widen, and store; lanes past nbc are zero, which pads the scale rows
  // to a multiple of 16 as the compute tile expects.
  float* dout = p.d + r * p.d_stride;
  float* mout = p.m + r * p.d_stride;
  for (int64_t g = 0; g < nbc; g += 16) {
    __m128i quads[4];
    for (int q = 0; q < 4; ++q) {
      int32_t w4[4];
      for (int i = 0; i < 4; ++i) {
        const int64_t blk = g + 4 * q + i;
        w4[i] = 0;
        if (blk < nbc) std::memcpy(&w4[i], &blocks[blk], 4);
      }
      quads[q] = _mm_setr_epi32(w4[0], w4[1], w4[2], w4[3]);
    }
    const __m512i v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(quads[0]), quads[1], 1)),
        _mm256_inserti128_si256(_mm256_castsi128_si256(quads[2]), quads[3], 1), 1);
    _mm512_store_ps(dout + g, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
    if constexpr (QuantTraits<kType>::kHasMin) {
      _mm512_store_ps(mout + g, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))));
    }
  }
}

// Lane i of the result is the horizontal sum of v[i] (a transpose-and-add tree: 45 ops instead of 16 reductions).
inline __m512 reduce16(const __m512* v) {
  __m512 s2[8];
  for (int i = 0; i < 8; ++i) {
    s2[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m512 s4[4];
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(s2[2 * i]), b = _mm512_castps_pd(s2[2 * i + 1]);
    s4[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 ef = _mm512_add_ps(_mm512_shuffle_f32x4(s4[0], s4[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(s4[0], s4[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 gh = _mm512_add_ps(_mm512_shuffle_f32x4(s4[2], s4[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(s4[2], s4[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(ef, gh, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(ef, gh, _MM_SHUFFLE(3, 1, 3, 1)));
}

inline __m512 load_scale_pair(const float* p) {
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)))));
}

struct TileArgs {
  const uint8_t* pq;  // panel quants of the tile's first row, at the chunk start
  const float* pd;
  const float* pm;
  int64_t pq_stride, pd_stride;
  const int8_t* xq;  // activations of the tile's first token, at the chunk start
  const float* xd;
  const float* xs;
  int64_t xq_stride, xd_stride;
  int64_t pairs;   // block pairs in the chunk (an odd last block counts as a pair)
  int64_t min16;   // 16-block groups for the min term
  float* y;        // output of (first token, first row)
  int64_t y_stride;
  bool accumulate;  // add to y (later K-chunks) instead of storing
};

template <int R, int T, int kOffset, bool kHasMin>
void compute_tile(const TileArgs& g) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t p = 0; p < g.pairs; ++p) {
    __m512i w[R];
    __m512 dw[R];
    for (int r = 0; r < R; ++r) {
      w[r] = _mm512_load_si512(g.pq + r * g.pq_stride + p * kPanelPairBytes);
      dw[r] = load_scale_pair(g.pd + r * g.pd_stride + 2 * p);
    }
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_load_si512(g.xq + t * g.xq_stride + p * kPanelPairBytes);
      const __m512 dx = load_scale_pair(g.xd + t * g.xd_stride + 2 * p);
      __m512i init = zero;
      if constexpr (kOffset != 0) {
        init = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(static_cast<char>(kOffset)), xv));
      }
      for (int r = 0; r < R; ++r) {
        const __m512i isum = _mm512_dpbusd_epi32(init, w[r], xv);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[r], dx), acc[r][t]);
      }
    }
  }
  if constexpr (kHasMin) {
    for (int64_t k = 0; k < g.min16; ++k) {
      for (int r = 0; r < R; ++r) {
        const __m512 m = _mm512_load_ps(g.pm + r * g.pd_stride + 16 * k);
        for (int t = 0; t < T; ++t) {
          acc[r][t] = _mm512_fmadd_ps(m, _mm512_loadu_ps(g.xs + t * g.xd_stride + 16 * k), acc[r][t]);
        }
      }
    }
  }
  if constexpr (R == 4 && T == 4) {
    __m512 by_token[16];
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) by_token[4 * t + r] = acc[r][t];
    }
    alignas(64) float sums[16];  // [4t + r]
    _mm512_store_ps(sums, reduce16(by_token));
    for (int t = 0; t < T; ++t) {
      float* out = g.y + t * g.y_stride;
      __m128 v = _mm_load_ps(sums + 4 * t);
      if (g.accumulate) v = _mm_add_ps(v, _mm_loadu_ps(out));
      _mm_storeu_ps(out, v);
    }
  } else {
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) {
        const float v = hsum(acc[r][t]);
        float* out = g.y + t * g.y_stride + r;
        *out = g.accumulate ? *out + v : v;
      }
    }
  }
}

using TileFn = void (*)(const TileArgs&);

template <int kOffset, bool kHasMin, int R>
constexpr TileFn tile_for_tokens(int T) {
  return T == 1 ? compute_tile<R, 1, kOffset, kHasMin>
                : T == 2 ? compute_tile<R, 2, kOffset, kHasMin>
                         : T == 3 ? compute_tile<R, 3, kOffset, kHasMin> : compute_tile<R, 4, kOffset, kHasMin>;
}

template <int kOffset, bool kHasMin>
TileFn tile_for(int rows, int tokens) {
  switch (rows) {
    case 1:
      return tile_for_tokens<kOffset, kHasMin, 1>(tokens);
    case 2:
      return tile_for_tokens<kOffset, kHasMin, 2>(tokens);
    case 3:
      return tile_for_tokens<kOffset, kHasMin, 3>(tokens);
    default:
      return tile_for_tokens<kOffset, kHasMin, 4>(tokens);
  }
}

// f16 d (and Q4_1 m) of blocks [b, b + n), n <= 16, widened to f32 in lanes 0..n-1 (other lanes zero).
template <DType kType>
inline void block_scales16(const typename QuantTraits<kType>::Block* blk, int64_t n, __m512* d, __m512* m) {
  __m128i quads[4];
  for (int q = 0; q < 4; ++q) {
    int32_t w4[4];
    for (int i = 0; i < 4; ++i) {
      w4[i] = 0;
      if (4 * q + i < n) std::memcpy(&w4[i], &blk[4 * q + i], 4);
    }
    quads[q] = _mm_setr_epi32(w4[0], w4[1], w4[2], w4[3]);
  }
  const __m512i v = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(quads[0]), quads[1], 1)),
      _mm256_inserti128_si256(_mm256_castsi128_si256(quads[2]), quads[3], 1), 1);
  *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
  if constexpr (QuantTraits<kType>::kHasMin) *m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
}

// One token, rows read straight from the GGML blocks (no panel): the decode path. Performs exactly the arithmetic
// of compute_tile<R, 1> on a decoded panel, so results do not depend on which path (or thread split) ran.
template <DType kType, int R>
void direct_tile(const uint8_t* row0, int64_t row_bytes, int64_t nb, const int8_t* xq, const float* xd,
                 const float* xs, float* y) {
  using Traits = QuantTraits<kType>;
  using Block = typename Traits::Block;
  constexpr int64_t kMaxGroups = kChunkBlocks / 16;
  const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[R];
  alignas(64) float mins[R][kMaxGroups * 16];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < nb; g += 16) {
    const int64_t n = imin(16, nb - g);
    // d_w·d_x of 16 blocks per row: the same products compute_tile forms pair by pair.
    const __m512 dx16 = _mm512_loadu_ps(xd + g);
    __m512 dwdx16[R];
    for (int r = 0; r < R; ++r) {
      __m512 d16, m16 = _mm512_setzero_ps();
      block_scales16<kType>(reinterpret_cast<const Block*>(row0 + r * row_bytes) + g, n, &d16, &m16);
      dwdx16[r] = _mm512_mul_ps(d16, dx16);
      if constexpr (Traits::kHasMin) _mm512_store_ps(&mins[r][g], m16);
    }
    for (int64_t j = 0; j < n; j += 2) {
      const int64_t b = g + j;
      const bool single = j + 1 == n;
      const __m512i xv = _mm512_load_si512(xq + b * kQBlock);
      const __m512i idx = _mm512_add_epi32(pair_idx, _mm512_set1_epi32(static_cast<int>(j)));
      __m512i init = zero;
      if constexpr (Traits::kOffset != 0) {
        init = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(static_cast<char>(Traits::kOffset)), xv));
      }
      for (int r = 0; r < R; ++r) {
        const auto* blk = reinterpret_cast<const Block*>(row0 + r * row_bytes) + b;
        if (g_pf_dist != 0) _mm_prefetch(reinterpret_cast<const char*>(blk) + g_pf_dist * row_bytes, _MM_HINT_T0);
        const __m512i isum = _mm512_dpbusd_epi32(init, unpack_pair<kType>(blk, single), xv);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_permutexvar_ps(idx, dwdx16[r]), acc[r]);
      }
    }
  }
  if constexpr (Traits::kHasMin) {
    for (int64_t g = 0; g < nb; g += 16) {
      const __m512 sv = _mm512_loadu_ps(xs + g);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_load_ps(&mins[r][g]), sv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hsum(acc[r]);
}

template <DType kType>
void direct_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t, float* y) {
  const int8_t* xq = a.q + t * a.q_stride;
  const float* xd = a.d + t * a.d_stride;
  const float* xs = a.s != nullptr ? a.s + t * a.d_stride : nullptr;
  int64_t r = r0;
  for (; r + kRowTile <= r1; r += kRowTile) direct_tile<kType, 4>(w.data + r * w.row_bytes, w.row_bytes, a.nb, xq, xd, xs, y + r);
  for (; r < r1; ++r) direct_tile<kType, 1>(w.data + r * w.row_bytes, w.row_bytes, a.nb, xq, xd, xs, y + r);
}

template <DType kType>
void quant_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  using Traits = QuantTraits<kType>;
  if (t1 - t0 == 1 && a.nb <= kChunkBlocks) return direct_range<kType>(w, a, r0, r1, t0, y + t0 * y_stride);
  const int64_t nb = a.nb;
  const int64_t chunk = imin(kChunkBlocks, nb);
  Panel panel;
  panel.q_stride = (chunk + 1) / 2 * kPanelPairBytes;
  panel.d_stride = (chunk + 15) / 16 * 16;
  const size_t panel_bytes = static_cast<size_t>(kGroupRows * (panel.q_stride + 2 * panel.d_stride * 4));
  auto* base = static_cast<uint8_t*>(thread_scratch(ScratchSlot::kPanel, panel_bytes));
  panel.q = base;
  panel.d = reinterpret_cast<float*>(base + kGroupRows * panel.q_stride);
  panel.m = panel.d + kGroupRows * panel.d_stride;
  for (int64_t g0 = r0; g0 < r1; g0 += kGroupRows) {
    const int64_t rows = imin(kGroupRows, r1 - g0);
    for (int64_t b0 = 0; b0 < nb; b0 += kChunkBlocks) {
      const int64_t nbc = imin(kChunkBlocks, nb - b0);
      for (int64_t r = 0; r < rows; ++r) decode_row<kType>(w.data + (g0 + r) * w.row_bytes, b0, nbc, panel, r);
      TileArgs args;
      args.pd_stride = panel.d_stride;
      args.pq_stride = panel.q_stride;
      args.xq_stride = a.q_stride;
      args.xd_stride = a.d_stride;
      args.pairs = (nbc + 1) / 2;
      args.min16 = (nbc + 15) / 16;
      args.y_stride = y_stride;
      args.accumulate = b0 > 0;
      for (int64_t t = t0; t < t1; t += kTokenTile) {
        const int nt = static_cast<int>(imin(kTokenTile, t1 - t));
        args.xq = a.q + t * a.q_stride + b0 * kQBlock;
        args.xd = a.d + t * a.d_stride + b0;
        args.xs = a.s != nullptr ? a.s + t * a.d_stride + b0 : nullptr;
        for (int64_t r = 0; r < rows; r += kRowTile) {
          const int nr = static_cast<int>(imin(kRowTile, rows - r));
          args.pq = panel.q + r * panel.q_stride;
          args.pd = panel.d + r * panel.d_stride;
          args.pm = panel.m + r * panel.d_stride;
          args.y = y + t * y_stride + g0 + r;
          tile_for<Traits::kOffset, Traits::kHasMin>(nr, nt)(args);
        }
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
    case DType::kQ8_0:
      return quant_range<DType::kQ8_0>;
    case DType::kQ4_K:
    case DType::kQ6_K:
      return avx512_k_kernel_for(type);
    default:
      return avx512_float_kernel_for(type);
  }
}

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels kernels{quantize_q8, avx512_quantize_q8k, avx512_round_f16, avx512_round_bf16, kernel_for};
  return kernels;
}

}  // namespace servetune::cpu::detail
