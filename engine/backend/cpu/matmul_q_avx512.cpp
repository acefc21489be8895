// AVX-512 VNNI kernels for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights × Q8 activations (quantized in
// quantize_act_avx512.cpp). Every path computes each output with ggml's x86 vec_dot arithmetic (see
// matmul_reference.cpp: 8 lanes of fma(d_w·d_x, 4-element partial, lane) per block, hsum8, + the min chain), so
// results equal llama.cpp's dot products and never depend on the batch, a token's place in it, or the thread split.
// Whole 16-token groups use the token-lane GEMM (matmul_tl_avx512.cpp); other tokens (decode) the row-pair kernel
// here: one zmm holds two rows' 8 lanes for one token.
#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_avx512.h"
#include "backend/cpu/matmul_internal.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

using namespace avx512;

constexpr int kPairs = 4;      // row pairs per tile (8 rows)
constexpr int kMaxTokens = 2;  // tokens per pass (weights are unpacked once per pass)

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
  const __m512i v =
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(quads[0]), quads[1], 1)),
                         _mm256_inserti128_si256(_mm256_castsi128_si256(quads[2]), quads[3], 1), 1);
  *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
  if constexpr (QuantTraits<kType>::kHasMin) *m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
}

// ggml's hsum_float_8 on both 256-bit halves at once: lane 0 gets ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)) of lanes 0-7,
// lane 8 the same of lanes 8-15.
inline __m512 hsum8_halves(__m512 v) {
  const __m512 a = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 b = _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_add_ps(b, _mm512_movehdup_ps(b));
}

// Row-pair kernel: rows [0, nrows) (nrows <= 2 * kPairs) from row0 × T tokens from t0, writing y[t*y_stride + r].
template <DType kType, int T>
void rowpair_tile(const uint8_t* row0, int64_t row_bytes, int64_t nrows, const Activations& a, int64_t t0, float* y,
                  int64_t y_stride) {
  using Traits = QuantTraits<kType>;
  using Block = typename Traits::Block;
  const __m512i zero = _mm512_setzero_si512();
  // Pair p holds rows ra[p], rb[p]; a short tile repeats its last row, whose copies are not stored.
  int64_t ra[kPairs], rb[kPairs];
  for (int p = 0; p < kPairs; ++p) {
    ra[p] = imin(2 * p, nrows - 1);
    rb[p] = imin(2 * p + 1, nrows - 1);
  }
  __m512 acc[kPairs][T], mins[kPairs][T];
  for (int p = 0; p < kPairs; ++p) {
    for (int t = 0; t < T; ++t) acc[p][t] = mins[p][t] = _mm512_setzero_ps();
  }
  alignas(64) float dw[2 * kPairs][16], mw[2 * kPairs][16];
  for (int64_t g = 0; g < a.nb; g += 16) {
    const int64_t n = imin(16, a.nb - g);
    for (int64_t i = 0; i < imin(nrows, 2 * kPairs); ++i) {
      __m512 d16, m16 = _mm512_setzero_ps();
      block_scales16<kType>(reinterpret_cast<const Block*>(row0 + i * row_bytes) + g, n, &d16, &m16);
      // One token: store d_w·d_x directly (the same products the T > 1 path forms block by block).
      if constexpr (T == 1) d16 = _mm512_mul_ps(d16, _mm512_loadu_ps(a.d + t0 * a.d_stride + g));
      _mm512_store_ps(dw[i], d16);
      _mm512_store_ps(mw[i], m16);
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t b = g + j;
      const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16),
                                           _mm512_set1_epi32(static_cast<int>(j)));
      __m512i x2[T], init[T];
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = a.q + (t0 + t) * a.q_stride + b * kQBlock;
        x2[t] = _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(xq)));
        init[t] = zero;
        if constexpr (Traits::kOffset != 0) {
          const __m512i offset = _mm512_set1_epi8(static_cast<char>(Traits::kOffset));
          init[t] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, x2[t]));
        }
      }
      for (int p = 0; p < kPairs; ++p) {
        const auto* blk_a = reinterpret_cast<const Block*>(row0 + ra[p] * row_bytes) + b;
        const auto* blk_b = reinterpret_cast<const Block*>(row0 + rb[p] * row_bytes) + b;
        // One prefetch per 64 bytes of each row's stream is enough.
        if (sizeof(Block) > 32 || j % 2 == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(blk_a) + kPrefetchBytes, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(blk_b) + kPrefetchBytes, _MM_HINT_T0);
        }
        const __m512i w = unpack_two<kType>(blk_a, blk_b);
        const __m512 d = _mm512_permutex2var_ps(_mm512_load_ps(dw[ra[p]]), idx, _mm512_load_ps(dw[rb[p]]));
        for (int t = 0; t < T; ++t) {
          const __m512 scale = T == 1 ? d : _mm512_mul_ps(d, _mm512_set1_ps(a.d[(t0 + t) * a.d_stride + b]));
          const __m512 q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init[t], w, x2[t]));
          acc[p][t] = _mm512_fmadd_ps(scale, q, acc[p][t]);
        }
        if constexpr (Traits::kHasMin) {
          const __m512 m = _mm512_permutex2var_ps(_mm512_load_ps(mw[ra[p]]), idx, _mm512_load_ps(mw[rb[p]]));
          for (int t = 0; t < T; ++t) {
            mins[p][t] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.s[(t0 + t) * a.d_stride + b]), mins[p][t]);
          }
        }
      }
    }
  }
  for (int p = 0; p < kPairs && 2 * p < nrows; ++p) {
    for (int t = 0; t < T; ++t) {
      __m512 v = hsum8_halves(acc[p][t]);
      if constexpr (Traits::kHasMin) v = _mm512_add_ps(v, mins[p][t]);
      alignas(64) float out[16];
      _mm512_store_ps(out, v);
      float* yt = y + (t0 + t) * y_stride;
      yt[ra[p]] = out[0];
      if (rb[p] != ra[p]) yt[rb[p]] = out[8];
    }
  }
}

template <DType kType>
void quant_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  // Whole token groups go to the token-lane GEMM (t0 is a multiple of kTokenGroup); the rest to the row-pair tiles.
  const int64_t group0 = t0 / kTokenGroup, group1 = imin(t1 / kTokenGroup, a.n_groups);
  if (a.xp != nullptr && group1 > group0) {
    avx512_tl_range(w, a, r0, r1, group0, group1, y, y_stride);
    t0 = group1 * kTokenGroup;
    if (t0 >= t1) return;
  }
  for (int64_t r = r0; r < r1; r += 2 * kPairs) {
    const int64_t nrows = imin(2 * kPairs, r1 - r);
    const uint8_t* row0 = w.data + r * w.row_bytes;
    int64_t t = t0;
    for (; t + kMaxTokens <= t1; t += kMaxTokens)
      rowpair_tile<kType, kMaxTokens>(row0, w.row_bytes, nrows, a, t, y + r, y_stride);
    for (; t < t1; ++t) rowpair_tile<kType, 1>(row0, w.row_bytes, nrows, a, t, y + r, y_stride);
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
    case DType::kQ4_K:
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
