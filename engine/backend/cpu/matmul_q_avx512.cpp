// AVX-512 VNNI kernels for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights × Q8 activations (quantized in
// quantize_act_avx512.cpp). Every path computes each output with the canonical arithmetic of matmul_reference.cpp
// (exact integer block dots, one fma per block in block order, + the min chain), so results never depend on the
// batch, a token's place in it, or the thread split. Whole 16-token groups use the token-lane GEMM
// (matmul_tl_avx512.cpp); other tokens (decode) the row-pair kernel here: one zmm holds two rows' block for one
// token, and block sums of 16 rows are regrouped to one lane per row before the float work.
#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;

constexpr int64_t kPanelRows = 16;  // rows per row-pair tile (8 pairs): one zmm lane each after the block sums
constexpr int kPassTokens = 4;      // tokens per pass (weights are unpacked once per pass)

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
struct QuantTraits<DType::kQ5_0> {
  using Block = BlockQ5_0;
  static constexpr int kOffset = 16;  // q_w = 5-bit value − 16
  static constexpr bool kHasMin = false;
};
template <>
struct QuantTraits<DType::kQ5_1> {
  using Block = BlockQ5_1;
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = true;
};
template <>
struct QuantTraits<DType::kQ8_0> {
  using Block = BlockQ8_0;
  static constexpr int kOffset = 128;  // stored as q_w + 128 so vpdpbusd sees unsigned weights
  static constexpr bool kHasMin = false;
};

// Quants of one block of row a and one of row b as 64 u8 ([a's 32 | b's 32], element order), in the kernels' offset
// form (Q8_0: q + 128; Q4_0, Q5_0: unsigned 4/5-bit codes; the offsets come back through QuantTraits::kOffset).
template <DType kType>
inline __m512i unpack_two(const typename QuantTraits<kType>::Block* a, const typename QuantTraits<kType>::Block* b) {
  if constexpr (kType == DType::kQ8_0) {
    const __m256i bias = _mm256_set1_epi8(-128);
    const __m256i qa = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a->qs)), bias);
    const __m256i qb = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs)), bias);
    return _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
  } else {
    // [A, A, B, B] in 128-bit lanes, odd lanes shifted right by 4: [A lo, A hi, B lo, B hi] after the mask.
    const __m256i aa = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a->qs)));
    const __m256i bb = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs)));
    const __m512i z = _mm512_srlv_epi64(_mm512_inserti64x4(_mm512_castsi256_si512(aa), bb, 1),
                                        _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    const __m512i low = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
    if constexpr (kType == DType::kQ5_0 || kType == DType::kQ5_1) {  // fifth bits: bit j of qh is element j's 16
      uint32_t ha, hb;
      std::memcpy(&ha, a->qh, 4);
      std::memcpy(&hb, b->qh, 4);
      const __mmask64 high = static_cast<__mmask64>(ha) | (static_cast<__mmask64>(hb) << 32);
      return _mm512_or_si512(low, _mm512_maskz_mov_epi8(high, _mm512_set1_epi8(0x10)));
    }
    return low;
  }
}

constexpr int64_t kChunkBlocks = 8;  // blocks per step: 8 row pairs × 8 blocks of exact integer dots at a time

// Σ of a token's 32 activation quants in one block (the offset correction of signed weight codes).
inline int32_t block_sum(const int8_t* xq) {
  const __m256i biased = _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(xq)), _mm256_set1_epi8(-128));
  const __m256i sad = _mm256_sad_epu8(biased, _mm256_setzero_si256());  // Σ (x + 128) in four u64 lanes
  const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
  return static_cast<int32_t>(_mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1)) - 32 * 128;
}

// z[j] holds row a's 8 quad dots (lanes 0-7) and row b's (lanes 8-15) of block j; the result holds the block sums
// [a: blocks 0-3, b: blocks 0-3, a: blocks 4-7, b: blocks 4-7] (exact integer adds).
inline __m512i reduce_pair_blocks(const __m512i* z) {
  __m512i m[4];
  for (int i = 0; i < 4; ++i) {
    m[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]), _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]));
  }
  const __m512i n0 = _mm512_add_epi32(_mm512_unpacklo_epi64(m[0], m[1]), _mm512_unpackhi_epi64(m[0], m[1]));
  const __m512i n1 = _mm512_add_epi32(_mm512_unpacklo_epi64(m[2], m[3]), _mm512_unpackhi_epi64(m[2], m[3]));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(n0, n1, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i32x4(n0, n1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The block sums of 16 rows from the 8 row pairs' reduce_pair_blocks layout (sums[p * 16 + lane]) to one vector per
// block with lane i = row i: 4x4 row-by-block tiles by 128-bit lane shuffles, then rows 0-7 | 8-15 of two blocks by a
// two-source lane permute, then the halves joined. Exact integer moves, three rounds of shuffles instead of 8 gathers.
inline void transpose_pair_sums(const int32_t* sums, __m512i* v) {
  __m512i s[8];
  for (int p = 0; p < 8; ++p) s[p] = _mm512_load_si512(sums + p * 16);
  __m512i u[4][2];  // rows 4q..4q+3 of blocks 0-3 (u[q][0]) and 4-7 (u[q][1]), row-major
  for (int q = 0; q < 4; ++q) {
    u[q][0] = _mm512_shuffle_i32x4(s[2 * q], s[2 * q + 1], _MM_SHUFFLE(1, 0, 1, 0));
    u[q][1] = _mm512_shuffle_i32x4(s[2 * q], s[2 * q + 1], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // Lane k: block 2 * pair + k / 8 of row k % 8, from two 4x4 tiles (rows 0-3 | rows 4-7 as the second source).
  const __m512i pick[2] = {_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29),
                           _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31)};
  for (int h = 0; h < 2; ++h) {
    for (int pair = 0; pair < 2; ++pair) {
      const __m512i lo = _mm512_permutex2var_epi32(u[0][h], pick[pair], u[1][h]);  // rows 0-7 of the two blocks
      const __m512i hi = _mm512_permutex2var_epi32(u[2][h], pick[pair], u[3][h]);  // rows 8-15
      v[4 * h + 2 * pair] = _mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
      v[4 * h + 2 * pair + 1] = _mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
    }
  }
}

// Quad dots of token t's block b against a row pair's unpacked block w (one zmm: both rows' 8 quads).
inline __m512i pair_dot(__m512i w, const Activations& a, int64_t t, int64_t b) {
  const int8_t* xq = a.q + t * a.q_stride + b * kQBlock;
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(xq))));
}

// Row-pair kernel for tokens outside whole token groups (decode): 16 rows [0, rows) × T tokens from t0. Per 8 blocks,
// vpdpbusd gives each row pair's quad dots (one zmm: two rows' block), reduce_pair_blocks turns 8 of them into block
// sums, transpose_pair_sums turns those into one zmm per block with a lane per row, and one fma per block and row
// follows the canonical arithmetic. Up to 4 tokens share a pass's unpacking, which costs about what one token's dots
// do, so a verify step's drafts or a small batch's 3rd and 4th tokens do not pay it again; short tiles repeat their
// last row (not stored).
template <DType kType, int T>
void rowpair_tile(const uint8_t* row0, int64_t row_bytes, int64_t rows, const Activations& a, int64_t t0, float* y,
                  int64_t y_stride) {
  using Traits = QuantTraits<kType>;
  using Block = typename Traits::Block;
  const Block* row[16];
  for (int i = 0; i < 16; ++i) row[i] = reinterpret_cast<const Block*>(row0 + imin(i, rows - 1) * row_bytes);
  const __m512i row_offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                 _mm512_set1_epi32(static_cast<int>(row_bytes)));
  const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
  __m512 acc[T], mins[T];
  for (int t = 0; t < T; ++t) acc[t] = mins[t] = _mm512_setzero_ps();
  alignas(64) int32_t sums[T][8 * 16];
  for (int64_t b0 = 0; b0 < a.nb; b0 += kChunkBlocks) {
    const int n = static_cast<int>(imin(kChunkBlocks, a.nb - b0));
    for (int p = 0; p < 8; ++p) {
      if constexpr (T <= 2) {
        // Each block's unpacked weights feed the tokens' dots at once (2 × 8 dot registers fit).
        __m512i z[T][kChunkBlocks];
        for (int j = 0; j < kChunkBlocks; ++j) {
          if (j < n) {
            const __m512i w = unpack_two<kType>(row[2 * p] + b0 + j, row[2 * p + 1] + b0 + j);
            for (int t = 0; t < T; ++t) z[t][j] = pair_dot(w, a, t0 + t, b0 + j);
          } else {
            for (int t = 0; t < T; ++t) z[t][j] = _mm512_setzero_si512();
          }
        }
        for (int t = 0; t < T; ++t) _mm512_store_si512(sums[t] + p * 16, reduce_pair_blocks(z[t]));
      } else {
        // More tokens' dots would spill: the pair's 8 unpacked blocks stay in registers and serve one token at a time.
        __m512i w[kChunkBlocks];
        for (int j = 0; j < kChunkBlocks; ++j) {
          w[j] = j < n ? unpack_two<kType>(row[2 * p] + b0 + j, row[2 * p + 1] + b0 + j) : _mm512_setzero_si512();
        }
        for (int t = 0; t < T; ++t) {
          __m512i z[kChunkBlocks];
          for (int j = 0; j < kChunkBlocks; ++j) z[j] = j < n ? pair_dot(w[j], a, t0 + t, b0 + j) : _mm512_setzero_si512();
          _mm512_store_si512(sums[t] + p * 16, reduce_pair_blocks(z));
        }
      }
      // The same blocks of the next tile's row pair, whose short rows the hardware prefetcher does not get ahead of.
      for (int h = 0; h < 2; ++h) {
        const char* next = reinterpret_cast<const char*>(row0 + (16 + 2 * p + h) * row_bytes) + b0 * static_cast<int64_t>(sizeof(Block));
        for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(Block)); off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
      }
    }
    __m512i block_sums[T][kChunkBlocks];
    for (int t = 0; t < T; ++t) transpose_pair_sums(sums[t], block_sums[t]);
    for (int j = 0; j < n; ++j) {
      const int64_t b = b0 + j;
      // Each row's leading dword of block b: d, and m for Q4_1 / Q5_1.
      const __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, row_offsets, row[0] + b, 1);
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
      for (int t = 0; t < T; ++t) {
        __m512i isum = block_sums[t][j];
        const int8_t* xq = a.q + (t0 + t) * a.q_stride + b * kQBlock;
        if constexpr (Traits::kOffset != 0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(Traits::kOffset * block_sum(xq)));
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[(t0 + t) * a.d_stride + b]));
        acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[t]);
        if constexpr (Traits::kHasMin) {
          const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
          mins[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[(t0 + t) * a.d_stride + b]), mins[t]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    const __m512 v = Traits::kHasMin ? _mm512_add_ps(acc[t], mins[t]) : acc[t];
    _mm512_mask_storeu_ps(y + (t0 + t) * y_stride, valid, v);
  }
}

template <DType kType>
void quant_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  // Whole token groups go to the token-lane GEMM (t0 is a multiple of kTokenGroup); the rest to row-pair tiles.
  const int64_t group0 = t0 / kTokenGroup, group1 = imin(t1 / kTokenGroup, a.n_groups);
  if (a.xp != nullptr && group1 > group0) {
    avx512_tl_range(w, a, r0, r1, group0, group1, y, y_stride);
    t0 = group1 * kTokenGroup;
    if (t0 >= t1) return;
  }
  for (int64_t r = r0; r < r1; r += kPanelRows) {
    const int64_t rows = imin(kPanelRows, r1 - r);
    const uint8_t* row0 = w.data + r * w.row_bytes;
    int64_t t = t0;
    for (; t + kPassTokens <= t1; t += kPassTokens) rowpair_tile<kType, kPassTokens>(row0, w.row_bytes, rows, a, t, y + r, y_stride);
    switch (t1 - t) {  // the rest in one pass
      case 3:
        rowpair_tile<kType, 3>(row0, w.row_bytes, rows, a, t, y + r, y_stride);
        break;
      case 2:
        rowpair_tile<kType, 2>(row0, w.row_bytes, rows, a, t, y + r, y_stride);
        break;
      case 1:
        rowpair_tile<kType, 1>(row0, w.row_bytes, rows, a, t, y + r, y_stride);
        break;
      default:
        break;
    }
  }
}

RangeKernel kernel_for(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return quant_range<DType::kQ4_0>;
    case DType::kQ4_1:
      return quant_range<DType::kQ4_1>;
    case DType::kQ5_0:
      return quant_range<DType::kQ5_0>;
    case DType::kQ5_1:
      return quant_range<DType::kQ5_1>;
    case DType::kQ8_0:
      return quant_range<DType::kQ8_0>;
    case DType::kFP8_E4M3_B128:
      return avx512_fp8_block_range;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return avx512_k_kernel_for(type);
    default:
      return avx512_float_kernel_for(type);
  }
}

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels kernels{avx512_quantize_q8, avx512_quantize_q8k, avx512_round_f16,
                                  avx512_round_bf16,  kernel_for,          avx512_pack_token_groups};
  return kernels;
}

}  // namespace servetune::cpu::detail
