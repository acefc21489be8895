// Helpers shared by the AVX2 quantized matmul files (matmul_q_avx2.cpp, matmul_tl_avx2.cpp) only; never include from
// baseline code. Everything here has internal linkage, so no AVX2 instruction can leak into a baseline translation
// unit through COMDAT.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/quant.h"

namespace servetune::cpu::detail::avx2 {

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Software prefetch distance of the weight streams: short ones do not give the hardware prefetchers time to ramp up.
constexpr int64_t kPrefetchAhead = 6144;

// Passes v through an empty asm statement: a chain of 16-bit adds stays a chain. Unfenced, GCC reassociates the
// token-lane tile's eight pair-sum additions into trees whose partial sums no longer fit the 16 ymm registers and
// spill to the stack, which slows the tile down.
static inline void keep_in_register(__m256i& v) { asm("" : "+x"(v)); }

template <DType kType>
constexpr bool kHasMin = kType == DType::kQ4_1 || kType == DType::kQ5_1;

// log2 of the u8 offset of signed 4- and 5-bit codes (Q4_0: 8, Q5_0: 16); -1: no offset (unsigned codes, or Q8_0).
template <DType kType>
constexpr int kOffsetShift = kType == DType::kQ4_0   ? 3
                             : kType == DType::kQ5_0 ? 4
                                                     : -1;

// One block's 32 codes in element order as stored: Q4 nibbles and Q5 five-bit codes as u8 (Q4_0 / Q5_0 in their
// offset form, value + 8 / + 16), Q8_0 as its signed values.
template <DType kType>
static inline __m256i block_codes(const BlockOf<kType>* blk) {
  if constexpr (kType == DType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs));
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
    __m256i v = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1),
                                 _mm256_set1_epi8(0x0F));
    if constexpr (kType == DType::kQ5_0 || kType == DType::kQ5_1) {
      // Spread qh's 32 bits over the 32 bytes (byte j gets 0x10 when bit j is set).
      uint32_t qh;
      std::memcpy(&qh, blk->qh, 4);
      const __m256i spread =
          _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                              _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
      v = _mm256_or_si256(
          v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10)));
    }
    return v;
  }
}

}  // namespace servetune::cpu::detail::avx2
