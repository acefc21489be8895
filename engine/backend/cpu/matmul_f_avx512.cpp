// AVX-512 kernels for F32 / F16 / BF16 weights × f32 activations (a 4×4 rows × tokens FMA tile, masked column tail,
// one transpose-reduce per tile) and the f16 / bf16 rounding of activations that ggml applies before those dots.

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;

template <DType kType>
inline __m512 load_weights(const uint8_t* row, int64_t c, __mmask16 mask) {
  if constexpr (kType == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + c);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, reinterpret_cast<const uint16_t*>(row) + c);
    if constexpr (kType == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType kType, int R, int T>
void float_tile(const uint8_t* w0, int64_t row_bytes, const float* x0, int64_t x_stride, int64_t cols, float* y,
                int64_t y_stride) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 mask =
        cols - c >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (cols - c)) - 1u);
    __m512 w[R];
    for (int r = 0; r < R; ++r) w[r] = load_weights<kType>(w0 + r * row_bytes, c, mask);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x0 + t * x_stride + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
    }
  }
  store_tile_sums(acc, y, y_stride);
}

using FloatTileFn = void (*)(const uint8_t*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

template <DType kType, int R>
FloatTileFn tile_for_tokens(int T) {
  return T == 1   ? float_tile<kType, R, 1>
         : T == 2 ? float_tile<kType, R, 2>
         : T == 3 ? float_tile<kType, R, 3>
                  : float_tile<kType, R, 4>;
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
      const __mmask16 mask =
          cols - c >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (cols - c)) - 1u);
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

// Round-to-nearest-even to bf16 in integer arithmetic (no AVX-512 BF16 needed); NaN stays a quiet NaN.
void avx512_round_bf16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                       int64_t out_stride) {
  round_rows(x, x_stride, t0, t1, cols, out, out_stride, [](__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), high);
    const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), high);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, rounded, quiet));
  });
}

}  // namespace servetune::cpu::detail
