// Reference (plain C++) dequantization of the float, FP8 and GGML block formats (legacy and k-quants) and
// quantization of the legacy ones; matches gguf.quants bit for bit (float32 math, one rounding per operation).
#include "core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/half.h"

namespace servetune {
namespace {

// Products and sums are kept in separate statements so no compiler contracts them into one fused
// multiply-add: the reference rounds after every operation.

void dequant_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK4_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0x0F) - 8) * d;
      y[j + kQK4_0 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK4_1) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const float lo = static_cast<float>(x[i].qs[j] & 0x0F) * d;
      const float hi = static_cast<float>(x[i].qs[j] >> 4) * d;
      y[j] = lo + m;
      y[j + kQK4_1 / 2] = hi + m;
    }
  }
}

// Fifth bit of element j: bit j of the little-endian 32-bit qh.
uint32_t load_qh(const uint8_t qh[4]) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 | static_cast<uint32_t>(qh[2]) << 16 |
         static_cast<uint32_t>(qh[3]) << 24;
}

void dequant_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK5_0) {
    const float d = fp16_to_f32(x[i].d);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int lo = (x[i].qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1u) << 4;
      const int hi = (x[i].qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + kQK5_0 / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequant_q5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK5_1) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int lo = (x[i].qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1u) << 4;
      const int hi = (x[i].qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      const float lo_d = static_cast<float>(lo) * d;
      const float hi_d = static_cast<float>(hi) * d;
      y[j] = lo_d + m;
      y[j + kQK5_1 / 2] = hi_d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK8_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// fp16 -> float keeping NaN payloads bit for bit (signalling NaNs stay signalling), as numpy's float16 cast
// and so gguf.quants do; half.h's fp16_to_f32 (like F16C hardware) sets the quiet bit.
float fp16_to_f32_keep_nan(uint16_t h) {
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0) {
    return bits_to_f32(static_cast<uint32_t>(h & 0x8000u) << 16 | 0x7F800000u |
                       static_cast<uint32_t>(h & 0x03FFu) << 13);
  }
  return fp16_to_f32(h);
}

void dequant_fp8_e4m3(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp8_e4m3_to_f32(x[i]);
}

// ---- k-quants: 256-element super-blocks of 16 or 8 sub-blocks with their own scales ----

// Q2_K: 16 sub-blocks of 16; scales[s] holds a 4-bit scale (low) and 4-bit min (high). The 2-bit codes of
// elements 128*h + 32*k + l sit at bits 2k..2k+1 of qs[32*h + l].
void dequant_q2_k(const BlockQ2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int e = 0; e < kQK_K; ++e) {
      const uint8_t sc = x[i].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0x0F);
      const float ml = dmin * static_cast<float>(sc >> 4);
      const int shift = 2 * ((e % 128) / 32);
      const int q = (x[i].qs[32 * (e / 128) + e % 32] >> shift) & 3;
      const float v = dl * static_cast<float>(q);
      y[e] = v - ml;
    }
  }
}

// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales (low 4 bits in scales[0..7] nibbles, high 2 bits in
// scales[8..11]); 2-bit codes as Q2_K plus a high bit in hmask (bit e/32 of hmask[e%32]) that, when clear,
// subtracts 4.
int q3_k_scale(const uint8_t sc[12], int j) {
  const int low = j < 8 ? sc[j] & 0x0F : sc[j - 8] >> 4;
  const int high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | high << 4) - 32;
}

void dequant_q3_k(const BlockQ3_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (int e = 0; e < kQK_K; ++e) {
      const float dl = d * static_cast<float>(q3_k_scale(x[i].scales, e / 16));
      const int shift = 2 * ((e % 128) / 32);
      const int low = (x[i].qs[32 * (e / 128) + e % 32] >> shift) & 3;
      const int high_set = (x[i].hmask[e % 32] >> (e / 32)) & 1;
      y[e] = dl * static_cast<float>(low - (high_set ? 0 : 4));
    }
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed into 12 bytes.
void k4_scale_min(const uint8_t s[kKScaleSize], int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 0x3F;
    *m = s[j + 4] & 0x3F;
  } else {
    *sc = (s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4;
    *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// Sub-block j's 4-bit codes: low nibbles (j even) or high nibbles (j odd) of qs[32*(j/2) .. +32].
int k4_nibble(const uint8_t* qs, int j, int l) {
  const uint8_t byte = qs[32 * (j / 2) + l];
  return j % 2 == 0 ? byte & 0x0F : byte >> 4;
}

void dequant_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int j = 0; j < kQK_K / 32; ++j) {
      int sc, m;
      k4_scale_min(x[i].scales, j, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        const float v = d1 * static_cast<float>(k4_nibble(x[i].qs, j, l));
        y[32 * j + l] = v - m1;
      }
    }
  }
}

// Q5_K: Q4_K plus a fifth bit: bit j of qh[l] for element 32*j + l.
void dequant_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    const float d = fp16_to_f32(x[i].d);
    const float dmin = fp16_to_f32(x[i].dmin);
    for (int j = 0; j < kQK_K / 32; ++j) {
      int sc, m;
      k4_scale_min(x[i].scales, j, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        const int q = k4_nibble(x[i].qs, j, l) | ((x[i].qh[l] >> j) & 1) << 4;
        const float v = d1 * static_cast<float>(q);
        y[32 * j + l] = v - m1;
      }
    }
  }
}

// Q6_K: 16 sub-blocks of 16 with int8 scales; element e = 128*h + r takes its low 4 bits from
// ql[64*h + r%64] (nibble r/64) and its high 2 bits from bits 2*(r/32) of qh[32*h + r%32]; code - 32.
void dequant_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    const float d = fp16_to_f32(x[i].d);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, r = e % 128;
      const int low = (x[i].ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
      const int high = (x[i].qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
      const float dl = d * static_cast<float>(x[i].scales[e / 16]);
      y[e] = dl * static_cast<float>((low | high << 4) - 32);
    }
  }
}

// Q8_K (activations of k-quant dot products): float scale, int8 codes; bsums are not needed to decode.
void dequant_q8_k(const BlockQ8_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    for (int j = 0; j < kQK_K; ++j) y[j] = x[i].d * static_cast<float>(x[i].qs[j]);
  }
}

// Index of the first element with the largest magnitude (numpy's argmax of abs).
int argmax_abs(const float* x, int n) {
  int best = 0;
  for (int j = 1; j < n; ++j) {
    if (std::fabs(x[j]) > std::fabs(x[best])) best = j;
  }
  return best;
}

void min_max(const float* x, int n, float* lo, float* hi) {
  *lo = x[0];
  *hi = x[0];
  for (int j = 1; j < n; ++j) {
    *lo = std::min(*lo, x[j]);
    *hi = std::max(*hi, x[j]);
  }
}

// ggml's roundf: halves away from zero (the gguf package's np_roundf). Non-finite input (only reachable from
// non-finite weights) gives 0 instead of undefined behaviour.
int8_t round_q8(float v) {
  const float r = std::round(v);
  if (!(r == r)) return 0;
  return static_cast<int8_t>(std::clamp(r, -128.0f, 127.0f));
}

void quant_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) y[i].qs[j] = round_q8(x[j] * id);
  }
}

// Truncating quantizer shared by the legacy 4/5-bit types: q = min(qmax, trunc(v * id + offset)).
// Non-finite input gives 0.
uint8_t trunc_clamp(float scaled, float offset, int qmax) {
  const float shifted = scaled + offset;
  if (!(shifted >= 0.0f)) return 0;
  return static_cast<uint8_t>(std::min(static_cast<float>(qmax), std::trunc(shifted)));
}

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK4_0) {
    const float max = x[argmax_abs(x, kQK4_0)];
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const uint8_t q0 = trunc_clamp(x[j] * id, 8.5f, 15);
      const uint8_t q1 = trunc_clamp(x[j + kQK4_0 / 2] * id, 8.5f, 15);
      y[i].qs[j] = static_cast<uint8_t>(q0 | q1 << 4);
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK4_1) {
    float min, max;
    min_max(x, kQK4_1, &min, &max);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const uint8_t q0 = trunc_clamp((x[j] - min) * id, 0.5f, 15);
      const uint8_t q1 = trunc_clamp((x[j + kQK4_1 / 2] - min) * id, 0.5f, 15);
      y[i].qs[j] = static_cast<uint8_t>(q0 | q1 << 4);
    }
  }
}

// Packs 32 five-bit values: low nibbles as Q4, fifth bits into the little-endian qh word.
void pack_q5(const uint8_t q[32], uint8_t qh[4], uint8_t qs[16]) {
  uint32_t h = 0;
  for (int j = 0; j < 32; ++j) h |= static_cast<uint32_t>(q[j] >> 4) << j;
  for (int b = 0; b < 4; ++b) qh[b] = static_cast<uint8_t>(h >> (8 * b));
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
}

void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK5_0) {
    const float max = x[argmax_abs(x, kQK5_0)];
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[kQK5_0];
    for (int j = 0; j < kQK5_0; ++j) q[j] = trunc_clamp(x[j] * id, 16.5f, 31);
    y[i].d = f32_to_fp16(d);
    pack_q5(q, y[i].qh, y[i].qs);
  }
}

void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK5_1) {
    float min, max;
    min_max(x, kQK5_1, &min, &max);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[kQK5_1];
    for (int j = 0; j < kQK5_1; ++j) q[j] = trunc_clamp((x[j] - min) * id, 0.5f, 31);
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    pack_q5(q, y[i].qh, y[i].qs);
  }
}

// Number of blocks in `n` elements of `t`; a partial block is a caller bug.
int64_t block_count(DType t, int64_t n, const char* what) {
  const int64_t bs = dtype_info(t).block_size;
  if (n < 0 || n % bs != 0) {
    throw Error(ErrorKind::kInternal, std::string(what) + ": " + std::to_string(n) + " elements of " +
                                          std::string(dtype_name(t)) + " is not a whole number of " +
                                          std::to_string(bs) + "-element blocks");
  }
  return n / bs;
}

}  // namespace

bool can_dequantize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kFP8_E4M3:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ8_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  if (!can_dequantize(t)) throw_unsupported("no dequantizer for tensor type " + std::string(dtype_name(t)));
  const int64_t nb = block_count(t, n, "dequantize_row");
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32_keep_nan(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kFP8_E4M3:
      return dequant_fp8_e4m3(static_cast<const uint8_t*>(src), dst, n);
    case DType::kQ4_0:
      return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::kQ4_1:
      return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case DType::kQ5_0:
      return dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case DType::kQ5_1:
      return dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case DType::kQ8_0:
      return dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case DType::kQ2_K:
      return dequant_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb);
    case DType::kQ3_K:
      return dequant_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb);
    case DType::kQ4_K:
      return dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case DType::kQ5_K:
      return dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case DType::kQ6_K:
      return dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case DType::kQ8_K:
      return dequant_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb);
    default:
      throw_unsupported("no dequantizer for tensor type " + std::string(dtype_name(t)));
  }
}

void dequantize_fp8_block_row(const uint8_t* codes, const float* block_scales, float* dst, int64_t n) {
  for (int64_t c = 0; c < n; ++c) dst[c] = fp8_e4m3_to_f32(codes[c]) * block_scales[c / kFp8ScaleBlock];
}

bool can_quantize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kFP8_E4M3:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
      return true;
    default:
      return false;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  if (!can_quantize(t)) throw_unsupported("no quantizer for tensor type " + std::string(dtype_name(t)));
  const int64_t nb = block_count(t, n, "quantize_row");
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kFP8_E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp8_e4m3(src[i]);
      return;
    }
    case DType::kQ8_0:
      return quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::kQ4_0:
      return quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::kQ4_1:
      return quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case DType::kQ5_0:
      return quant_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case DType::kQ5_1:
      return quant_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    default:
      throw_unsupported("no quantizer for tensor type " + std::string(dtype_name(t)));
  }
}

}  // namespace servetune
