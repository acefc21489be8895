// AVX-512 VNNI k-quant kernels: Q4_K, Q5_K, Q6_K weights × Q8_K activations. Whole 16-token groups go to the
// token-lane GEMM (matmul_k_tl_avx512.cpp); the other tokens (decode) to row panels here: each of 16 rows' super-blocks
// is decoded once per pass of up to four tokens, vpmaddubsw and vpdpwssd with the sub-block scales give sixteen exact
// partial sums per row and token, and a transposing tree of adds turns the 16 rows' partials into one vector of exact
// integer sums with a lane per row. A super-block then costs one fma (and one for the mins) per 16 rows and token:
// the canonical arithmetic of matmul_k_reference.cpp.
#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/matmul_k_simd.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;
using kquant::Traits;

constexpr int64_t kPanelRows = 16;
constexpr int kPassTokens = 4;

// Index vector for vpermw: int16 lane i takes source element first + i / lanes_per_value.
inline __m512i lane_index(int first, int lanes_per_value) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(first + i / lanes_per_value);
  return _mm512_load_si512(idx);
}

// A super-block as the panel tiles use it: 4 × 64 codes in element order (kquant::Decoded's codes, pairwise), the
// vpdpwssd multipliers of each code register's pair sums (its sub-blocks' scales), the bsum coefficients, d, dmin.
struct PanelBlock {
  __m512i codes[4];
  __m512i scale[4];
  __m256i coefs;
  float d, dmin;
};

// Index vectors for decode_panel_block's vpermw: word i of codes[k]'s multipliers takes the scale of sub-block
// first(k) + i / lanes (Q4_K, Q5_K: 32-element sub-blocks, unduplicated; Q6_K: 16-element ones).
template <DType kType>
struct ScaleIndex {
  __m512i idx[4];
  ScaleIndex() {
    for (int k = 0; k < 4; ++k) idx[k] = kType == DType::kQ6_K ? lane_index(4 * k, 8) : lane_index(2 * k, 16);
  }
};

// kquant::decode's result in 512-bit registers: a code register takes one broadcast load and two operations.
template <DType kType>
inline void decode_panel_block(const typename Traits<kType>::Block& b, const ScaleIndex<kType>& si, PanelBlock& out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  constexpr __mmask32 kUpperWords = 0xFFFF0000u;
  if constexpr (kType == DType::kQ6_K) {
    // As kquant::decode: element 128h + r takes the nibble r / 64 of ql[64h + r % 64] and bits 2·(r / 32) of
    // qh[32h + r % 32]; a register holds r = 0-63 (low nibbles) or 64-127 (high nibbles) of one h.
    const __m512i bits45 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h)));
      const __m512i hs = _mm512_mask_srli_epi16(qh, kUpperWords, qh, 2);  // [qh | qh >> 2]: bits 0-1 / 4-5 per half
      out.codes[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_slli_epi16(hs, 4), bits45));
      out.codes[2 * h + 1] =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), _mm512_and_si512(hs, bits45));
    }
    const __m256i words = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    out.coefs = words;
    for (int k = 0; k < 4; ++k) out.scale[k] = _mm512_permutexvar_epi16(si.idx[k], _mm512_castsi256_si512(words));
    out.d = _cvtsh_ss(b.d);
    out.dmin = 0.0f;
  } else {
    // codes[k]: the low nibbles of qs[32k .. 32k + 31], then their high nibbles.
    for (int k = 0; k < 4; ++k) {
      const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * k)));
      out.codes[k] = _mm512_and_si512(_mm512_mask_srli_epi16(raw, kUpperWords, raw, 4), low4);
    }
    if constexpr (kType == DType::kQ5_K) {
      // Fifth bits: element 32j + l (j = 2k, 2k + 1 in codes[k]) has bit j of qh[l].
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
      for (int k = 0; k < 4; ++k) {
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * k))),
                                               _mm256_set1_epi8(static_cast<char>(2 << (2 * k))), 1);
        out.codes[k] = _mm512_mask_add_epi8(out.codes[k], _mm512_test_epi8_mask(qh, bit), out.codes[k],
                                            _mm512_set1_epi8(0x10));
      }
    }
    const __m128i sm = kquant::unpack_scales_mins(b.scales);
    const __m512i words = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));  // scales 0-7, mins 0-7
    for (int k = 0; k < 4; ++k) out.scale[k] = _mm512_permutexvar_epi16(si.idx[k], words);
    out.coefs = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));  // each min twice
    out.d = _cvtsh_ss(b.d);
    out.dmin = _cvtsh_ss(b.dmin);
  }
}

// v[r] holds two groups of eight partial sums of row r (lanes 0-7, 8-15); lane r of `low` / `high` is the sum of
// v[r]'s first / second group (exact integer adds).
inline void reduce_rows(const __m512i* v, __m512i& low, __m512i& high) {
  __m512i a[8], b[4];
  for (int i = 0; i < 8; ++i) {
    a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  }
  // Each 128-bit lane L of b[i] holds rows 4i .. 4i+3, summed over the original lanes 4L .. 4L+3.
  for (int i = 0; i < 4; ++i) {
    b[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_epi64(a[2 * i], a[2 * i + 1]));
  }
  const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(b[2], b[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(b[2], b[3], _MM_SHUFFLE(3, 1, 3, 1)));
  low = _mm512_shuffle_i32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0));
  high = _mm512_shuffle_i32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1));
}

// Rows [0, rows) of a panel starting at row0 × tokens [t0, t0 + T). Short panels repeat their last row (not stored).
template <DType kType, int T>
void k_panel_tile(const uint8_t* row0, int64_t row_bytes, int64_t rows, int64_t nb, const Activations& a, int64_t t0,
                  float* y, int64_t y_stride) {
  using Tr = Traits<kType>;
  using Block = typename Tr::Block;
  const Block* row[kPanelRows];
  for (int i = 0; i < kPanelRows; ++i) row[i] = reinterpret_cast<const Block*>(row0 + imin(i, rows - 1) * row_bytes);
  const ScaleIndex<kType> scale_idx;
  // The same super-blocks of the next panel, fetched a panel ahead: the hardware prefetchers do not follow 16 streams.
  const char* next = reinterpret_cast<const char*>(row0) + kPanelRows * row_bytes;
  __m512 acc[T], mins[T];
  for (int t = 0; t < T; ++t) acc[t] = mins[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    alignas(64) int32_t part[T][kPanelRows][16];  // per token and row: its partial sums (see reduce_rows)
    alignas(64) float dw[kPanelRows], dmw[kPanelRows];
    for (int i = 0; i < kPanelRows; ++i) {
      const char* ahead = next + i * row_bytes + b * static_cast<int64_t>(sizeof(Block));
      for (int64_t off = 0; off < static_cast<int64_t>(sizeof(Block)); off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
      PanelBlock blk;
      decode_panel_block<kType>(row[i][b], scale_idx, blk);
      dw[i] = blk.d;
      dmw[i] = blk.dmin;
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = a.q + (t0 + t) * a.q_stride + b * kQK_K;
        __m512i isum = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          const __m512i pairs = _mm512_maddubs_epi16(blk.codes[k], _mm512_load_si512(xq + 64 * k));
          isum = _mm512_dpwssd_epi32(isum, pairs, blk.scale[k]);
        }
        const __m256i bsums =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums + (t0 + t) * a.bsum_stride + b * 16));
        const __m256i bterm = _mm256_madd_epi16(bsums, blk.coefs);
        __m512i v;
        if constexpr (Tr::kHasMin) {
          const __m256i folded = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
          v = _mm512_inserti64x4(_mm512_castsi256_si512(folded), bterm, 1);
        } else {  // Q6_K: codes − 32
          v = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(bterm, 5)));
        }
        _mm512_store_si512(part[t][i], v);
      }
    }
    const __m512 d = _mm512_load_ps(dw);
    [[maybe_unused]] const __m512 dmin = _mm512_load_ps(dmw);
    for (int t = 0; t < T; ++t) {
      __m512i v[kPanelRows], low, high;
      for (int i = 0; i < kPanelRows; ++i) v[i] = _mm512_load_si512(part[t][i]);
      reduce_rows(v, low, high);
      const __m512 dx = _mm512_set1_ps(a.d[(t0 + t) * a.d_stride + b]);
      if constexpr (Tr::kHasMin) {
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(low), acc[t]);
        mins[t] = _mm512_fmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(high), mins[t]);
      } else {
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(_mm512_add_epi32(low, high)), acc[t]);
      }
    }
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
  for (int t = 0; t < T; ++t) {
    const __m512 v = Tr::kHasMin ? _mm512_sub_ps(acc[t], mins[t]) : acc[t];
    _mm512_mask_storeu_ps(y + (t0 + t) * y_stride, keep, v);
  }
}

template <DType kType>
void k_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
             int64_t y_stride) {
  // Whole token groups go to the token-lane GEMM (t0 is a multiple of kTokenGroup); the rest to row panels.
  const int64_t group0 = t0 / kTokenGroup, group1 = imin(t1 / kTokenGroup, a.n_groups);
  if (a.xp != nullptr && group1 > group0) {
    avx512_k_tl_range(w, a, r0, r1, group0, group1, y, y_stride);
    t0 = group1 * kTokenGroup;
    if (t0 >= t1) return;
  }
  const int64_t nb = w.cols / kQK_K;
  for (int64_t r = r0; r < r1; r += kPanelRows) {
    const int64_t rows = imin(kPanelRows, r1 - r);
    const uint8_t* row0 = w.data + r * w.row_bytes;
    for (int64_t t = t0; t < t1; t += kPassTokens) {
      switch (imin(kPassTokens, t1 - t)) {
        case 1:
          k_panel_tile<kType, 1>(row0, w.row_bytes, rows, nb, a, t, y + r, y_stride);
          break;
        case 2:
          k_panel_tile<kType, 2>(row0, w.row_bytes, rows, nb, a, t, y + r, y_stride);
          break;
        case 3:
          k_panel_tile<kType, 3>(row0, w.row_bytes, rows, nb, a, t, y + r, y_stride);
          break;
        default:
          k_panel_tile<kType, 4>(row0, w.row_bytes, rows, nb, a, t, y + r, y_stride);
          break;
      }
    }
  }
}

}  // namespace

RangeKernel avx512_k_kernel_for(DType type) {
  switch (type) {
    case DType::kQ4_K:
      return k_range<DType::kQ4_K>;
    case DType::kQ5_K:
      return k_range<DType::kQ5_K>;
    case DType::kQ6_K:
      return k_range<DType::kQ6_K>;
    default:
      return nullptr;
  }
}

}  // namespace servetune::cpu::detail
