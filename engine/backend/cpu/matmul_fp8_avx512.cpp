// AVX-512 kernel for block-scaled FP8 weights (kFP8_E4M3_B128) × f32 activations: codes widened and multiplied by
// their block's scale 32 at a time, then matmul_f_avx512.cpp's 4×4 rows × tokens FMA tile (same column order, same
// masked tail, accumulators summed across lanes only at the end of the row), so every output equals the F32 kernel's
// on the dequantized matrix bit for bit. A tile of up to 4 tokens dequantizes in registers; more tokens share each
// dequantization: 4 rows × 512 columns at a time into a panel that stays in L1 while every token tile passes over it.

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;

// Columns of one panel: 4 rows of them (8 KB of f32) stay in L1 next to the activations the token tiles read.
constexpr int64_t kPanelCols = 4 * kFp8ScaleBlock;

// 32 codes (those under `mask`; the others read as 0) as the f16 bits of 2^-8 times their E4M3 values, exactly:
// sign-extended to 16 bits and shifted by 7, a code's magnitude bits land in an f16's exponent and mantissa (its
// subnormals become f16 subnormals) and its sign in bit 15 (bit 14 cleared); S.1111.111 becomes an f16 NaN.
// simd_avx512.h's load_fp8_scaled, 32 codes a time (the integer steps cost the same for 32 as for 16). kMasked false:
// all 32 (a plain load: see fma_group).
template <bool kMasked = true>
inline __m512i widen_fp8(const uint8_t* p, __mmask32 mask) {
  const __m256i codes =
      kMasked ? _mm256_maskz_loadu_epi8(mask, p) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i w = _mm512_cvtepi8_epi16(codes);
  const __m512i h = _mm512_and_si512(_mm512_slli_epi16(w, 7), _mm512_set1_epi16(static_cast<int16_t>(0xBF80)));
  const __m512i top = _mm512_set1_epi16(0x3F80);  // the magnitude of S.1111.111; doubled, an f16 NaN
  return _mm512_mask_add_epi16(h, _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, top), top), h, h);
}

// Half `kHalf` (codes 16·kHalf .. 16·kHalf + 15) of widen_fp8's 32 times the block's scale times 2^8, which undoes
// the 2^-8: (v·2^-8)·(s·2^8) is the exact product v·s rounded once, as dequantize_fp8_block_row rounds it. Lanes
// outside `mask` become 0 (not 0·s: an infinite scale would make NaN).
template <int kHalf>
inline __m512 dequantize(__m512i halves, __mmask16 mask, __m512 scale256) {
  const __m256i h = kHalf == 0 ? _mm512_castsi512_si256(halves) : _mm512_extracti64x4_epi64(halves, 1);
  return _mm512_maskz_mul_ps(mask, _mm512_cvtph_ps(h), scale256);
}

// BlockScales::row, spelled out here: an ISA file must not instantiate inline code that baseline files share.
inline const float* scale_row(const BlockScales& s, int64_t r) {
  return s.data + (r + s.row_offset) / kFp8ScaleBlock * s.stride;
}

// The codes and scale rows of a tile's (up to 4) rows.
struct TileRows {
  const uint8_t* codes = nullptr;
  int64_t row_bytes = 0;
  const float* scales[kRowTile] = {};
};

// The FMAs of one 16-column group: weights w[R] times the tile's tokens. kMasked false: all 16 columns, by plain loads
// (see load_floats).
template <int R, int T, bool kMasked = true>
inline void fma_group(const __m512* w, const float* x0, int64_t x_stride, int64_t c, __mmask16 mask,
                      __m512 (&acc)[R * T]) {
  for (int t = 0; t < T; ++t) {
    const __m512 xv = load_floats<kMasked>(x0 + t * x_stride + c, mask);
    for (int r = 0; r < R; ++r) acc[r * T + t] = _mm512_fmadd_ps(w[r], xv, acc[r * T + t]);
  }
}

// Columns [c0, c1) of one scale block, dequantized in registers: 32 a step, as two 16-column groups in column order
// (the F32 kernel's order). kFull: a whole block, so no lane is masked off.
template <int R, int T, bool kFull>
inline void direct_block(const TileRows& rows, const __m512* scale, const float* x0, int64_t x_stride, int64_t c0,
                         int64_t c1, __m512 (&acc)[R * T]) {
  for (int64_t c = c0; c < c1; c += 32) {
    const __mmask32 mask = kFull ? static_cast<__mmask32>(0xFFFFFFFFu) : tail_mask32(c1 - c);
    const __mmask16 lo = kFull ? static_cast<__mmask16>(0xFFFF) : tail_mask(c1 - c);
    const __mmask16 hi = kFull ? static_cast<__mmask16>(0xFFFF) : tail_mask(c1 - c - 16);
    __m512i halves[R];
    for (int r = 0; r < R; ++r) halves[r] = widen_fp8<!kFull>(rows.codes + r * rows.row_bytes + c, mask);
    __m512 w[R];
    for (int r = 0; r < R; ++r) w[r] = dequantize<0>(halves[r], lo, scale[r]);
    fma_group<R, T, !kFull>(w, x0, x_stride, c, lo, acc);
    if (!kFull && hi == 0) break;
    for (int r = 0; r < R; ++r) w[r] = dequantize<1>(halves[r], hi, scale[r]);
    fma_group<R, T, !kFull>(w, x0, x_stride, c + 16, hi, acc);
  }
}

// R rows × T tokens over all columns, dequantizing in registers (decode: each weight serves at most 4 tokens).
template <int R, int T>
void direct_tile(const TileRows& rows, const float* x0, int64_t x_stride, int64_t cols, float* y, int64_t y_stride) {
  __m512 acc[R * T];
  for (int i = 0; i < R * T; ++i) acc[i] = _mm512_setzero_ps();
  const auto block_scales = [&](int64_t c0, __m512* scale) {
    for (int r = 0; r < R; ++r) scale[r] = _mm512_set1_ps(rows.scales[r][c0 / kFp8ScaleBlock] * 256.0f);
  };
  // The whole blocks in a loop of plain loads, the partial last block after it.
  const int64_t whole = cols / kFp8ScaleBlock * kFp8ScaleBlock;
  for (int64_t c0 = 0; c0 < whole; c0 += kFp8ScaleBlock) {
    __m512 scale[R];
    block_scales(c0, scale);
    direct_block<R, T, true>(rows, scale, x0, x_stride, c0, c0 + kFp8ScaleBlock, acc);
  }
  if (whole < cols) {
    __m512 scale[R];
    block_scales(whole, scale);
    direct_block<R, T, false>(rows, scale, x0, x_stride, whole, cols, acc);
  }
  store_tile_sums<R, T>(acc, y, y_stride);
}

// R rows × T tokens over columns [c0, c1) of dequantized rows in `panel` (column c at panel[r * kPanelCols + c - c0]),
// the accumulators carried between panels in `carry` (16 vectors a tile); the sums go to y after the last panel.
template <int R, int T>
void panel_tile(const float* panel, const float* x0, int64_t x_stride, int64_t c0, int64_t c1, bool first, bool last,
                __m512* carry, float* y, int64_t y_stride) {
  __m512 acc[R * T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r * T + t] = first ? _mm512_setzero_ps() : carry[r * kTokenTile + t];
  }
  for (int64_t c = c0; c < c1; c += 16) {
    const __mmask16 mask = tail_mask(c1 - c);
    __m512 w[R];
    for (int r = 0; r < R; ++r) w[r] = _mm512_maskz_loadu_ps(mask, panel + r * kPanelCols + (c - c0));
    fma_group<R, T>(w, x0, x_stride, c, mask, acc);
  }
  if (last) {
    store_tile_sums<R, T>(acc, y, y_stride);
    return;
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) carry[r * kTokenTile + t] = acc[r * T + t];
  }
}

using DirectTileFn = void (*)(const TileRows&, const float*, int64_t, int64_t, float*, int64_t);
using PanelTileFn = void (*)(const float*, const float*, int64_t, int64_t, int64_t, bool, bool, __m512*, float*, int64_t);

template <int R>
DirectTileFn direct_for_tokens(int T) {
  return T == 1 ? direct_tile<R, 1> : T == 2 ? direct_tile<R, 2> : T == 3 ? direct_tile<R, 3> : direct_tile<R, 4>;
}
DirectTileFn direct_for(int R, int T) {
  return R == 1   ? direct_for_tokens<1>(T)
         : R == 2 ? direct_for_tokens<2>(T)
         : R == 3 ? direct_for_tokens<3>(T)
                  : direct_for_tokens<4>(T);
}
template <int R>
PanelTileFn panel_for_tokens(int T) {
  return T == 1 ? panel_tile<R, 1> : T == 2 ? panel_tile<R, 2> : T == 3 ? panel_tile<R, 3> : panel_tile<R, 4>;
}
PanelTileFn panel_for(int R, int T) {
  return R == 1   ? panel_for_tokens<1>(T)
         : R == 2 ? panel_for_tokens<2>(T)
         : R == 3 ? panel_for_tokens<3>(T)
                  : panel_for_tokens<4>(T);
}

// Columns [c0, c1) (c0 on a block boundary) of the tile's `n_rows` rows dequantized into the panel.
void dequantize_panel(const TileRows& rows, int n_rows, int64_t c0, int64_t c1, float* panel) {
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* codes = rows.codes + r * rows.row_bytes;
    for (int64_t b = c0; b < c1; b += kFp8ScaleBlock) {
      const __m512 scale = _mm512_set1_ps(rows.scales[r][b / kFp8ScaleBlock] * 256.0f);
      const int64_t b1 = imin(c1, b + kFp8ScaleBlock);
      for (int64_t c = b; c < b1; c += 32) {
        const __m512i halves = widen_fp8(codes + c, tail_mask32(b1 - c));
        float* out = panel + r * kPanelCols + (c - c0);
        _mm512_storeu_ps(out, dequantize<0>(halves, tail_mask(b1 - c), scale));
        _mm512_storeu_ps(out + 16, dequantize<1>(halves, tail_mask(b1 - c - 16), scale));
      }
    }
  }
}

}  // namespace

void avx512_fp8_block_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                            float* y, int64_t y_stride) {
  const bool shared = t1 - t0 > kTokenTile;
  const int64_t token_tiles = (t1 - t0 + kTokenTile - 1) / kTokenTile;
  float* panel = nullptr;
  __m512* carry = nullptr;
  if (shared) {
    const size_t panel_bytes = static_cast<size_t>(kRowTile * kPanelCols) * sizeof(float);
    auto* scratch = static_cast<uint8_t*>(thread_scratch(
        ScratchSlot::kDequant, panel_bytes + static_cast<size_t>(token_tiles * kRowTile * kTokenTile) * sizeof(__m512)));
    panel = reinterpret_cast<float*>(scratch);
    carry = reinterpret_cast<__m512*>(scratch + panel_bytes);
  }
  for (int64_t r = r0; r < r1; r += kRowTile) {
    const int nr = static_cast<int>(imin(kRowTile, r1 - r));
    TileRows rows;
    rows.codes = w.data + r * w.row_bytes;
    rows.row_bytes = w.row_bytes;
    for (int i = 0; i < nr; ++i) rows.scales[i] = scale_row(w.scales, r + i);
    if (!shared) {
      for (int64_t t = t0; t < t1; t += kTokenTile) {
        const int nt = static_cast<int>(imin(kTokenTile, t1 - t));
        direct_for(nr, nt)(rows, a.f + t * a.f_stride, a.f_stride, w.cols, y + t * y_stride + r, y_stride);
      }
      continue;
    }
    for (int64_t c0 = 0; c0 < w.cols; c0 += kPanelCols) {
      const int64_t c1 = imin(w.cols, c0 + kPanelCols);
      dequantize_panel(rows, nr, c0, c1, panel);
      for (int64_t i = 0; i < token_tiles; ++i) {
        const int64_t t = t0 + i * kTokenTile;
        const int nt = static_cast<int>(imin(kTokenTile, t1 - t));
        panel_for(nr, nt)(panel, a.f + t * a.f_stride, a.f_stride, c0, c1, c0 == 0, c1 == w.cols,
                          carry + i * kRowTile * kTokenTile, y + t * y_stride + r, y_stride);
      }
    }
  }
}

}  // namespace servetune::cpu::detail
