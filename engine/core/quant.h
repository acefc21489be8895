// GGML block-quantization layouts (bit-compatible with ggml-common.h) and reference (de)quantization of rows.
// The reference routines are plain C++ and serve as the oracle for every SIMD/GPU kernel.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace servetune {

constexpr int kQK4_0 = 32;
constexpr int kQK4_1 = 32;
constexpr int kQK5_0 = 32;
constexpr int kQK5_1 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK_K = 256;
constexpr int kKScaleSize = 12;

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;              // fp16 scale
  uint8_t qs[kQK4_0 / 2];  // nibbles: element j in low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qs[kQK4_1 / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // fifth bits
  uint8_t qs[kQK5_0 / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
// The block struct of a 32-element quant type (Q4_0, Q4_1, Q5_0, Q5_1; anything else: Q8_0), for kernels templated on it.
template <DType kType>
using BlockOf = std::conditional_t<
    kType == DType::kQ4_0, BlockQ4_0,
    std::conditional_t<kType == DType::kQ4_1, BlockQ4_1,
                       std::conditional_t<kType == DType::kQ5_0, BlockQ5_0,
                                          std::conditional_t<kType == DType::kQ5_1, BlockQ5_1, BlockQ8_0>>>>;
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // scales and mins, 4 bits each
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 &&
              sizeof(BlockQ8_K) == 292);

// True when dequantize_row supports `t`: F32, F16, BF16, FP8_E4M3, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, Q8_K.
bool can_dequantize(DType t);

// Converts `n` elements of type `t` at `src` to float, bit for bit as gguf.quants.dequantize (gguf 0.19.0;
// NaN payloads included). Q8_K and FP8_E4M3 (OCP "fn": bias 7, no inf, 0x7F/0xFF NaN) have no gguf reference.
// Throws Error(kUnsupported) for types without a dequantizer and Error(kInternal) when `n` is not a multiple
// of the type's block size.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// One row of a kFP8_E4M3_B128 matrix: dst[c] = fp8_e4m3_to_f32(codes[c]) * block_scales[c / 128] for c < n (one f32
// rounding per value), `block_scales` being the row's ceil(n / 128) scales (BlockScales::row). The oracle of the
// block-scaled FP8 matmul kernels and how the loader dequantizes such weights for backends that keep bf16.
void dequantize_fp8_block_row(const uint8_t* codes, const float* block_scales, float* dst, int64_t n);

// Reference quantizers (round-to-nearest, as ggml's *_ref functions and gguf.quants.quantize) for F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and FP8_E4M3 (core/half.h's f32_to_fp8_e4m3: saturating, no gguf reference).
// Throws Error(kUnsupported) for other types, Error(kInternal) for a partial block. Non-finite inputs give defined
// but unspecified codes.
bool can_quantize(DType t);
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace servetune
