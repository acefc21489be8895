// Helpers shared by the AVX-512 kernel files (*_avx512.cpp) only; never include from baseline code. Everything
// here has internal linkage, so no AVX-512 instruction can leak into a baseline translation unit through COMDAT.
#pragma once

// GCC 12 warns about the deliberately undefined vectors inside the AVX-512 intrinsic headers (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "backend/cpu/simd_avx512.h"

namespace servetune::cpu::detail::avx512 {

// Software prefetch distance of the decode paths. A small matrix's weight stream is too short for the hardware
// prefetchers to ramp up (and they stop at 4 KB pages); prefetching this far ahead keeps decode's weight streams
// near the memory bandwidth.
constexpr int64_t kPrefetchBytes = 6144;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Lanes of the `left` columns still to do (all when 16 or more; none when left <= 0).
static inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF)
                    : left <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << left) - 1u);
}
// The same for 32 lanes of 16-bit elements (left > 0).
static inline __mmask32 tail_mask32(int64_t left) {
  return left >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu) : static_cast<__mmask32>((1u << left) - 1u);
}
// 16 floats, masked only when kMasked: GCC 12 keeps a tile's accumulators in registers across a loop of plain loads,
// but stores every one of them to the stack on each step of a loop with masked loads (even all-ones masks), which
// doubled a 2-token float tile's time. So the float and FP8 tiles run whole steps unmasked and mask only the tail.
template <bool kMasked>
static inline __m512 load_floats(const float* p, __mmask16 mask) {
  return kMasked ? _mm512_maskz_loadu_ps(mask, p) : _mm512_loadu_ps(p);
}

// Horizontal reductions (GCC 12's _mm512_reduce_* trip -Wuninitialized inside the intrinsic headers).
static inline __m512 fold_lanes_add(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
}
static inline float hsum(__m512 v) {
  __m128 x = _mm512_castps512_ps128(fold_lanes_add(v));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
static inline float hmax(__m512 v) {
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 x = _mm512_castps512_ps128(v);
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
// y[t * y_stride + r] = the lane sum of acc[r * T + t] for a float tile of up to 4 rows x 4 tokens, by one
// transpose-reduce for the whole tile (a horizontal sum per output costs more than the multiply-adds at small models'
// widths). Lane i of the reduction depends on its own accumulator alone, so a smaller tile (padded with zeros) gives an
// output the same bits as the full one: the float kernels' and the FP8 kernels' shared arithmetic.
template <int R, int T>
static inline void store_tile_sums(const __m512 (&acc)[R * T], float* y, int64_t y_stride) {
  static_assert(R <= 4 && T <= 4, "one 16-lane reduction per tile");
  __m512 all[16];
  for (int i = 0; i < 16; ++i) all[i] = _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) all[t * 4 + r] = acc[r * T + t];
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, simd::Avx512::reduce(all));
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) y[t * y_stride + r] = sums[t * 4 + r];
  }
}
static inline int hsum_i32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(x);
}
static inline int hsum_i32(__m512i v) {
  return hsum_i32(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

// f32 -> f16 (round to nearest even) -> f32, as ggml stores its Q8 scales.
static inline float f16_round_trip(float v) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
}

// Transposes a 16×16 matrix of 32-bit elements held in 16 registers (row i in v[i]).
static inline void transpose16(__m512i* v) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Now 128-bit lane L of v[4m + c] holds column 4L + c of rows 4m .. 4m+3; gather the four lanes of each column.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(v[i], v[i + 4], _MM_SHUFFLE(2, 0, 2, 0));
    t[i + 4] = _mm512_shuffle_i32x4(v[i], v[i + 4], _MM_SHUFFLE(3, 1, 3, 1));
    t[i + 8] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
    t[i + 12] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], _MM_SHUFFLE(2, 0, 2, 0));
    v[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], _MM_SHUFFLE(3, 1, 3, 1));
    v[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
    v[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

}  // namespace servetune::cpu::detail::avx512
