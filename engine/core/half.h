// Scalar conversions between float and the narrow float formats (IEEE fp16, bfloat16, OCP FP8 E4M3), exact and
// branch-light. Rounding is round-to-nearest-even (as torch and the gguf package do); NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace servetune {

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float fp16_to_f32(uint16_t h) {
  // Magic-number conversion (exact for normals, subnormals, inf and NaN).
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = bits_to_f32(0x7800000u);
  const float normalized = bits_to_f32((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = bits_to_f32((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result = sign | (two_w < denormalized_cutoff ? f32_to_bits(denormalized) : f32_to_bits(normalized));
  return bits_to_f32(result);
}

inline uint16_t f32_to_fp16(float f) {
  const float scale_to_inf = bits_to_f32(0x77800000u);
  const float scale_to_zero = bits_to_f32(0x08800000u);
  float abs_f = bits_to_f32(f32_to_bits(f) & 0x7FFFFFFFu);
  float base = (abs_f * scale_to_inf) * scale_to_zero;
  const uint32_t w = f32_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_to_f32((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

// A bf16 value's bits as a type of its own, so kernels templated on the element type (the CPU attention) tell it
// from an IEEE half stored as uint16_t. Same size and layout as uint16_t.
struct Bf16Bits {
  uint16_t bits;
};
static_assert(sizeof(Bf16Bits) == 2);

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// OCP FP8 E4M3 ("fn": bias 7, no infinities, S.1111.111 is NaN, largest finite 448): exact.
inline float fp8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0x0Fu;
  const uint32_t man = b & 0x07u;
  if (exp == 0x0Fu && man == 0x07u) return bits_to_f32(sign | 0x7FC00000u);
  if (exp == 0) return bits_to_f32(sign | f32_to_bits(static_cast<float>(man) * 0x1p-9f));  // subnormal m * 2^-9
  return bits_to_f32(sign | (exp + 127 - 7) << 23 | man << 20);
}

// Float to FP8 E4M3, round to nearest even, saturating: magnitudes from 448 up (infinity included) give ±448, as
// vLLM's and SGLang's FP8 KV caches store them (a plain cast would give NaN); NaN gives NaN (S.1111.111).
inline uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t u = f32_to_bits(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;
  if (a >= 0x43E00000u) return sign | 0x7Eu;  // 448
  if (a < 0x3C800000u) {                       // below 2^-6, the smallest normal: multiples of 2^-9
    const float quanta = bits_to_f32(a) * 512.0f;  // exact, < 8
    auto q = static_cast<uint32_t>(quanta);
    const float rest = quanta - static_cast<float>(q);
    if (rest > 0.5f || (rest == 0.5f && (q & 1u) != 0)) ++q;
    return static_cast<uint8_t>(sign | q);  // q == 8 is 2^-6, code 0x08
  }
  const uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);  // to 3 mantissa bits; a carry moves the exponent up
  return static_cast<uint8_t>(sign | ((rounded >> 20) - ((127u - 7u) << 3)));
}

}  // namespace servetune
