// AVX2 kernel for block-scaled FP8 weights (kFP8_E4M3_B128) × f32 activations: codes widened and multiplied by their
// block's scale 16 at a time, then matmul_f_avx2.cpp's 4×2 rows × tokens FMA tile (same column order, same scalar
// column tail after the lane sums), so every output equals the F32 kernel's on the dequantized matrix bit for bit.
// A tile of up to 2 tokens dequantizes in registers; more tokens share each dequantization: 4 rows × 512 columns at a
// time into a panel that stays in L1 while every token tile passes over it.
#include <cstring>

#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/simd_avx2.h"

namespace servetune::cpu::detail {
namespace {

constexpr int kRows = 4;
constexpr int kTokens = 2;
constexpr int64_t kPanelCols = 4 * kFp8ScaleBlock;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 codes dequantized: simd::Avx2::load_fp8_scaled gives 2^-8 times their values exactly, the scale times 2^8 undoes
// that, so each value is the exact product of code and scale rounded once (as dequantize_fp8_block_row rounds it).
inline __m256 dequantize(const uint8_t* p, float scale) {
  return _mm256_mul_ps(simd::Avx2::load_fp8_scaled(p), _mm256_set1_ps(scale * 256.0f));
}

// 16 codes dequantized the same way into lo (codes 0-7) and hi (8-15): load_fp8_scaled's integer steps on 16 lanes
// at once, which halves their cost.
inline void dequantize16(const uint8_t* p, float scale, __m256& lo, __m256& hi) {
  const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBF80)));
  const __m256i top = _mm256_set1_epi16(0x3F80);  // the magnitude of S.1111.111; doubled, an f16 NaN
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, top), top);
  h = _mm256_add_epi16(h, _mm256_and_si256(h, nan));
  const __m256 scale256 = _mm256_set1_ps(scale * 256.0f);
  lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale256);
  hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), scale256);
}

// `n` (< 8) codes dequantized into out[0 .. n), the same way.
inline void dequantize_tail(const uint8_t* p, int64_t n, float scale, float* out) {
  uint8_t codes[8] = {};
  std::memcpy(codes, p, static_cast<size_t>(n));
  float values[8];
  _mm256_storeu_ps(values, dequantize(codes, scale));
  std::memcpy(out, values, static_cast<size_t>(n) * sizeof(float));
}

// BlockScales::row, spelled out here: an ISA file must not instantiate inline code that baseline files share.
inline const float* scale_row(const BlockScales& s, int64_t r) {
  return s.data + (r + s.row_offset) / kFp8ScaleBlock * s.stride;
}

// The codes and scale rows of a tile's (up to 4) rows.
struct TileRows {
  const uint8_t* codes = nullptr;
  int64_t row_bytes = 0;
  const float* scales[kRows] = {};
};

template <int R, int T>
inline void fma_group(const __m256* w, const float* x0, int64_t x_stride, int64_t c, __m256 (&acc)[R][T]) {
  for (int t = 0; t < T; ++t) {
    const __m256 xv = _mm256_loadu_ps(x0 + t * x_stride + c);
    for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(w[r], xv, acc[r][t]);
  }
}

// The lane sums plus the scalar tail: columns [vec_cols, cols), whose dequantized values are tail[r][0 ..).
template <int R, int T>
void store_sums(const __m256 (&acc)[R][T], const float* const* tail, int64_t vec_cols, int64_t cols, const float* x0,
                int64_t x_stride, float* y, int64_t y_stride) {
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      float v = hsum(acc[r][t]);
      for (int64_t c = vec_cols; c < cols; ++c) v += tail[r][c - vec_cols] * x0[t * x_stride + c];
      y[t * y_stride + r] = v;
    }
  }
}

// R rows × T tokens over all columns, dequantizing in registers (decode: each weight serves at most 2 tokens).
template <int R, int T>
void direct_tile(const TileRows& rows, const float* x0, int64_t x_stride, int64_t cols, float* y, int64_t y_stride) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const int64_t vec_cols = cols / 8 * 8;
  for (int64_t c0 = 0; c0 < vec_cols; c0 += kFp8ScaleBlock) {
    float scale[R];
    for (int r = 0; r < R; ++r) scale[r] = rows.scales[r][c0 / kFp8ScaleBlock];
    const int64_t c1 = imin(vec_cols, c0 + kFp8ScaleBlock);
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16) {
      __m256 lo[R], hi[R];
      for (int r = 0; r < R; ++r) dequantize16(rows.codes + r * rows.row_bytes + c, scale[r], lo[r], hi[r]);
      fma_group<R, T>(lo, x0, x_stride, c, acc);
      fma_group<R, T>(hi, x0, x_stride, c + 8, acc);
    }
    if (c < c1) {  // 8 more
      __m256 w[R];
      for (int r = 0; r < R; ++r) w[r] = dequantize(rows.codes + r * rows.row_bytes + c, scale[r]);
      fma_group<R, T>(w, x0, x_stride, c, acc);
    }
  }
  float tail_values[R][8];
  const float* tail[R];
  for (int r = 0; r < R; ++r) {
    tail[r] = tail_values[r];
    if (vec_cols < cols) {
      dequantize_tail(rows.codes + r * rows.row_bytes + vec_cols, cols - vec_cols,
                      rows.scales[r][vec_cols / kFp8ScaleBlock], tail_values[r]);
    }
  }
  store_sums(acc, tail, vec_cols, cols, x0, x_stride, y, y_stride);
}

// R rows × T tokens over columns [c0, c1) of dequantized rows in `panel` (column c at panel[r * kPanelCols + c - c0]),
// the accumulators carried between panels in `carry` (8 vectors a tile); the sums go to y after the last panel.
template <int R, int T>
void panel_tile(const float* panel, const float* x0, int64_t x_stride, int64_t c0, int64_t c1, int64_t cols,
                __m256* carry, float* y, int64_t y_stride) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = c0 == 0 ? _mm256_setzero_ps() : carry[r * kTokens + t];
  }
  const int64_t vec_cols = cols / 8 * 8, vec_end = imin(c1, vec_cols);
  for (int64_t c = c0; c < vec_end; c += 8) {
    __m256 w[R];
    for (int r = 0; r < R; ++r) w[r] = _mm256_loadu_ps(panel + r * kPanelCols + (c - c0));
    fma_group<R, T>(w, x0, x_stride, c, acc);
  }
  if (c1 == cols) {
    const float* tail[R];
    for (int r = 0; r < R; ++r) tail[r] = panel + r * kPanelCols + (vec_cols - c0);
    store_sums(acc, tail, vec_cols, cols, x0, x_stride, y, y_stride);
    return;
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) carry[r * kTokens + t] = acc[r][t];
  }
}

using DirectTileFn = void (*)(const TileRows&, const float*, int64_t, int64_t, float*, int64_t);
using PanelTileFn = void (*)(const float*, const float*, int64_t, int64_t, int64_t, int64_t, __m256*, float*, int64_t);

template <int R>
DirectTileFn direct_for(int T) {
  return T == 1 ? direct_tile<R, 1> : direct_tile<R, 2>;
}
template <int R>
PanelTileFn panel_for(int T) {
  return T == 1 ? panel_tile<R, 1> : panel_tile<R, 2>;
}
DirectTileFn direct_for(int R, int T) {
  return R == 1 ? direct_for<1>(T) : R == 2 ? direct_for<2>(T) : R == 3 ? direct_for<3>(T) : direct_for<4>(T);
}
PanelTileFn panel_for(int R, int T) {
  return R == 1 ? panel_for<1>(T) : R == 2 ? panel_for<2>(T) : R == 3 ? panel_for<3>(T) : panel_for<4>(T);
}

// Columns [c0, c1) (c0 on a block boundary) of the tile's `n_rows` rows dequantized into the panel.
void dequantize_panel(const TileRows& rows, int n_rows, int64_t c0, int64_t c1, float* panel) {
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* codes = rows.codes + r * rows.row_bytes;
    float* out = panel + r * kPanelCols - c0;
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16) {
      __m256 lo, hi;
      dequantize16(codes + c, rows.scales[r][c / kFp8ScaleBlock], lo, hi);
      _mm256_storeu_ps(out + c, lo);
      _mm256_storeu_ps(out + c + 8, hi);
    }
    for (; c + 8 <= c1; c += 8) _mm256_storeu_ps(out + c, dequantize(codes + c, rows.scales[r][c / kFp8ScaleBlock]));
    if (c < c1) dequantize_tail(codes + c, c1 - c, rows.scales[r][c / kFp8ScaleBlock], out + c);
  }
}

}  // namespace

void avx2_fp8_block_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                          float* y, int64_t y_stride) {
  const bool shared = t1 - t0 > kTokens;
  const int64_t token_tiles = (t1 - t0 + kTokens - 1) / kTokens;
  float* panel = nullptr;
  __m256* carry = nullptr;
  if (shared) {
    const size_t panel_bytes = static_cast<size_t>(kRows * kPanelCols) * sizeof(float);
    auto* scratch = static_cast<uint8_t*>(thread_scratch(
        ScratchSlot::kDequant, panel_bytes + static_cast<size_t>(token_tiles * kRows * kTokens) * sizeof(__m256)));
    panel = reinterpret_cast<float*>(scratch);
    carry = reinterpret_cast<__m256*>(scratch + panel_bytes);
  }
  for (int64_t r = r0; r < r1; r += kRows) {
    const int nr = static_cast<int>(imin(kRows, r1 - r));
    TileRows rows;
    rows.codes = w.data + r * w.row_bytes;
    rows.row_bytes = w.row_bytes;
    for (int i = 0; i < nr; ++i) rows.scales[i] = scale_row(w.scales, r + i);
    if (!shared) {
      for (int64_t t = t0; t < t1; t += kTokens) {
        const int nt = static_cast<int>(imin(kTokens, t1 - t));
        direct_for(nr, nt)(rows, a.f + t * a.f_stride, a.f_stride, w.cols, y + t * y_stride + r, y_stride);
      }
      continue;
    }
    for (int64_t c0 = 0; c0 < w.cols; c0 += kPanelCols) {
      const int64_t c1 = imin(w.cols, c0 + kPanelCols);
      dequantize_panel(rows, nr, c0, c1, panel);
      for (int64_t i = 0; i < token_tiles; ++i) {
        const int64_t t = t0 + i * kTokens;
        const int nt = static_cast<int>(imin(kTokens, t1 - t));
        panel_for(nr, nt)(panel, a.f + t * a.f_stride, a.f_stride, c0, c1, w.cols, carry + i * kRows * kTokens,
                          y + t * y_stride + r, y_stride);
      }
    }
  }
}

}  // namespace servetune::cpu::detail
