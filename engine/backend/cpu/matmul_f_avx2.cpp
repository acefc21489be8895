// AVX2 kernels for F32 / F16 / BF16 weights × f32 activations (a 4×2 rows × tokens FMA tile, scalar column tail,
// the next tile's rows prefetched) and the f16 / bf16 rounding of activations that ggml applies before those dots.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_internal.h"

namespace servetune::cpu::detail {
namespace {

constexpr int kRows = 4;
constexpr int kTokens = 2;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <DType kType>
inline __m256 load_weights(const uint8_t* row, int64_t c) {
  if constexpr (kType == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
    if constexpr (kType == DType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType kType>
inline float weight_at(const uint8_t* row, int64_t c) {
  if constexpr (kType == DType::kF32) {
    float v;
    std::memcpy(&v, row + 4 * c, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * c, 2);
    if constexpr (kType == DType::kF16) {
      return _cvtsh_ss(h);
    } else {
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &u, 4);
      return v;
    }
  }
}

template <DType kType, int R, int T>
void float_tile(const uint8_t* w0, int64_t row_bytes, const float* x0, int64_t x_stride, int64_t cols, float* y,
                int64_t y_stride) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const int64_t vec_cols = cols / 8 * 8;
  constexpr int64_t kElementBytes = kType == DType::kF32 ? 4 : 2;
  for (int64_t c = 0; c < vec_cols; c += 8) {
    __m256 w[R];
    for (int r = 0; r < R; ++r) w[r] = load_weights<kType>(w0 + r * row_bytes, c);
    // The next tile's rows (right after this one's) at these columns: their 1-2 KB runs are too short for the
    // hardware prefetcher to get ahead of from DRAM.
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w0 + (R + r) * row_bytes + c * kElementBytes), _MM_HINT_T0);
    }
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x0 + t * x_stride + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(w[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      float v = hsum(acc[r][t]);
      for (int64_t c = vec_cols; c < cols; ++c) v += weight_at<kType>(w0 + r * row_bytes, c) * x0[t * x_stride + c];
      y[t * y_stride + r] = v;
    }
  }
}

using FloatTileFn = void (*)(const uint8_t*, int64_t, const float*, int64_t, int64_t, float*, int64_t);

template <DType kType, int R>
FloatTileFn tile_for_tokens(int T) {
  return T == 1 ? float_tile<kType, R, 1> : float_tile<kType, R, 2>;
}

template <DType kType>
void float_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  for (int64_t r = r0; r < r1; r += kRows) {
    const int nr = static_cast<int>(imin(kRows, r1 - r));
    for (int64_t t = t0; t < t1; t += kTokens) {
      const int nt = static_cast<int>(imin(kTokens, t1 - t));
      const FloatTileFn tile = nr == 1   ? tile_for_tokens<kType, 1>(nt)
                               : nr == 2 ? tile_for_tokens<kType, 2>(nt)
                               : nr == 3 ? tile_for_tokens<kType, 3>(nt)
                                         : tile_for_tokens<kType, 4>(nt);
      tile(w.data + r * w.row_bytes, w.row_bytes, a.f + t * a.f_stride, a.f_stride, w.cols, y + t * y_stride + r,
           y_stride);
    }
  }
}

inline float bf16_round_scalar(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    u = (u | 0x00400000u) & 0xFFFF0000u;
  } else {
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  }
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

RangeKernel avx2_float_kernel_for(DType type) {
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

void avx2_round_f16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                    int64_t out_stride) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    float* ot = out + t * out_stride;
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      _mm256_storeu_ps(ot + c, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(xt + c), _MM_FROUND_TO_NEAREST_INT)));
    }
    for (; c < cols; ++c) ot[c] = _cvtsh_ss(_cvtss_sh(xt[c], _MM_FROUND_TO_NEAREST_INT));
  }
}

void avx2_round_bf16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                     int64_t out_stride) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    float* ot = out + t * out_stride;
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const __m256 v = _mm256_loadu_ps(xt + c);
      const __m256i u = _mm256_castps_si256(v);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i rounded =
          _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), high);
      const __m256i quiet = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), high);
      const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
      _mm256_storeu_ps(ot + c, _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
    }
    for (; c < cols; ++c) ot[c] = bf16_round_scalar(xt[c]);
  }
}

}  // namespace servetune::cpu::detail
