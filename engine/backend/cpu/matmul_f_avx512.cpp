// AVX-512 kernels for F32 / F16 / BF16 weights × f32 activations (a 4×4 rows × tokens FMA tile, masked column tail,
// one transpose-reduce per tile) and the f16 / bf16 rounding of activations that ggml applies before those dots.
// BF16 rows are read 32 columns a load and widened in-lane (even columns by a shift, odd ones by a mask), against
// activations the rounding step stores in the matching even/odd order, so no weight crosses a lane.

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;

// Columns per BF16 step, and the activation layout avx512_round_bf16 writes for it: within each 32-column block, the
// even columns' values first, then the odd ones'.
constexpr int64_t kBf16Step = kFloatActCols;

// The rows of the next tile (right after this one's: rows are contiguous), at the columns this step reads: they are
// too short (1-2 KB at small models' widths) for the hardware prefetcher to get ahead of from DRAM.
template <int R>
inline void prefetch_next_tile(const uint8_t* w0, int64_t row_bytes, int64_t byte_offset) {
  for (int r = 0; r < R; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(w0 + (R + r) * row_bytes + byte_offset), _MM_HINT_T0);
  }
}

// Weights masked only in a tile's tail step, as load_floats (matmul_avx512.h) explains.
template <bool kMasked>
inline __m256i load_halves(const uint8_t* p, __mmask16 mask) {
  return kMasked ? _mm256_maskz_loadu_epi16(mask, p) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
template <bool kMasked>
inline __m512i load_bf16_pairs(const uint8_t* p, __mmask32 mask) {
  return kMasked ? _mm512_maskz_loadu_epi16(mask, p) : _mm512_loadu_si512(p);
}

// F32 / F16: 16 columns a step in column order (the FP8 kernels reproduce this order bit for bit).
template <DType kType, int R, int T>
void float_tile(const uint8_t* w0, int64_t row_bytes, const float* x0, int64_t x_stride, int64_t cols, float* y,
                int64_t y_stride) {
  __m512 acc[R * T];
  for (int i = 0; i < R * T; ++i) acc[i] = _mm512_setzero_ps();
  constexpr int64_t kElementBytes = kType == DType::kF32 ? 4 : 2;
  const auto step = [&]<bool kMasked>(int64_t c, __mmask16 mask) {
    __m512 w[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w0 + r * row_bytes + c * kElementBytes;
      if constexpr (kType == DType::kF32) {
        w[r] = load_floats<kMasked>(reinterpret_cast<const float*>(p), mask);
      } else {
        static_assert(kType == DType::kF16);
        w[r] = _mm512_cvtph_ps(load_halves<kMasked>(p, mask));
      }
    }
    prefetch_next_tile<R>(w0, row_bytes, c * kElementBytes);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = load_floats<kMasked>(x0 + t * x_stride + c, mask);
      for (int r = 0; r < R; ++r) acc[r * T + t] = _mm512_fmadd_ps(w[r], xv, acc[r * T + t]);
    }
  };
  const int64_t whole = cols / 16 * 16;
  for (int64_t c = 0; c < whole; c += 16) step.template operator()<false>(c, 0);
  if (whole < cols) step.template operator()<true>(whole, tail_mask(cols - whole));
  store_tile_sums<R, T>(acc, y, y_stride);
}

// BF16: 32 columns a step. A bf16 is the top half of its f32, so in each 32-bit lane the even column widens by a
// shift and the odd one by clearing the low half; the activations come in the matching order (kBf16Step), padded
// with zeros to a whole step.
template <int R, int T>
void bf16_tile(const uint8_t* w0, int64_t row_bytes, const float* x0, int64_t x_stride, int64_t cols, float* y,
               int64_t y_stride) {
  __m512 acc[R * T];
  for (int i = 0; i < R * T; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const auto step = [&]<bool kMasked>(int64_t c, __mmask32 mask) {
    __m512 even[R], odd[R];
    for (int r = 0; r < R; ++r) {
      const __m512i v = load_bf16_pairs<kMasked>(w0 + r * row_bytes + 2 * c, mask);
      even[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      odd[r] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    }
    prefetch_next_tile<R>(w0, row_bytes, 2 * c);
    for (int t = 0; t < T; ++t) {
      const __m512 xe = _mm512_load_ps(x0 + t * x_stride + c);
      const __m512 xo = _mm512_load_ps(x0 + t * x_stride + c + 16);
      for (int r = 0; r < R; ++r) {
        acc[r * T + t] = _mm512_fmadd_ps(even[r], xe, acc[r * T + t]);
        acc[r * T + t] = _mm512_fmadd_ps(odd[r], xo, acc[r * T + t]);
      }
    }
  };
  const int64_t whole = cols / kBf16Step * kBf16Step;
  for (int64_t c = 0; c < whole; c += kBf16Step) step.template operator()<false>(c, 0);
  if (whole < cols) step.template operator()<true>(whole, tail_mask32(cols - whole));
  store_tile_sums<R, T>(acc, y, y_stride);
}

using FloatTileFn = void (*)(const uint8_t*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

template <DType kType, int R, int T>
constexpr FloatTileFn tile_fn() {
  if constexpr (kType == DType::kBF16) {
    return bf16_tile<R, T>;
  } else {
    return float_tile<kType, R, T>;
  }
}

template <DType kType, int R>
FloatTileFn tile_for_tokens(int T) {
  return T == 1   ? tile_fn<kType, R, 1>()
         : T == 2 ? tile_fn<kType, R, 2>()
         : T == 3 ? tile_fn<kType, R, 3>()
                  : tile_fn<kType, R, 4>();
}

template <DType kType>
void float_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  for (int64_t r = r0; r < r1; r += kRowTile) {
    const int nr = static_cast<int>(imin(kRowTile, r1 - r));
    FloatTileFn tiles[4];
    for (int nt = 1; nt <= 4; ++nt) {
      tiles[nt - 1] = nr == 1   ? tile_for_tokens<kType, 1>(nt)
                      : nr == 2 ? tile_for_tokens<kType, 2>(nt)
                      : nr == 3 ? tile_for_tokens<kType, 3>(nt)
                                : tile_for_tokens<kType, 4>(nt);
    }
    for (int64_t t = t0; t < t1; t += kTokenTile) {
      const int nt = static_cast<int>(imin(kTokenTile, t1 - t));
      tiles[nt - 1](w.data + r * w.row_bytes, w.row_bytes, a.f + t * a.f_stride, a.f_stride, w.cols,
                    y + t * y_stride + r, y_stride);
    }
  }
}

template <class Round>
void round_rows(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out, int64_t out_stride,
                Round round) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 mask = tail_mask(cols - c);
      _mm512_mask_storeu_ps(out + t * out_stride + c, mask, round(_mm512_maskz_loadu_ps(mask, x + t * x_stride + c)));
    }
  }
}

}  // namespace

RangeKernel avx512_float_kernel_for(DType type) {
  switch (type) {
    case DType::kF32:
      return float_range<DType::kF32>;
    case DType::kF16:
      return float_range<DType::kF16>;
    case DType::kBF16:
      return float_range<DType::kBF16>;
    default:
      return nullptr;
  }
}

void avx512_round_f16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                      int64_t out_stride) {
  round_rows(x, x_stride, t0, t1, cols, out, out_stride, [](__m512 v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  });
}

// Round-to-nearest-even to bf16 in integer arithmetic (no AVX-512 BF16 needed); NaN stays a quiet NaN. Written in
// bf16_tile's order: each 32-column block's even columns, then its odd ones, zeros past `cols` up to a whole block
// (out_stride covers them: the driver pads float activation rows to kBf16Step).
void avx512_round_bf16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                       int64_t out_stride) {
  const auto round = [](__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), high);
    const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), high);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, rounded, quiet));
  };
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    float* ot = out + t * out_stride;
    for (int64_t c = 0; c < cols; c += kBf16Step) {
      const __m512 lo = round(_mm512_maskz_loadu_ps(tail_mask(cols - c), xt + c));
      const __m512 hi = round(_mm512_maskz_loadu_ps(tail_mask(cols - c - 16), xt + c + 16));
      _mm512_store_ps(ot + c, _mm512_permutex2var_ps(lo, even, hi));
      _mm512_store_ps(ot + c + 16, _mm512_permutex2var_ps(lo, odd, hi));
    }
  }
}

}  // namespace servetune::cpu::detail
