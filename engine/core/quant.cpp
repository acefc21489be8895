// Reference (plain C++) dequantization and quantization of GGML block formats; written to match
// the gguf Python package's gguf.quants bit for bit.
#include "core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/half.h"

namespace servetune {
namespace {

void dequant_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[i * kQK4_0 + j] = static_cast<float>((x[i].qs[j] & 0x0F) - 8) * d;
      y[i * kQK4_0 + j + kQK4_0 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      y[i * kQK4_1 + j] = static_cast<float>(x[i].qs[j] & 0x0F) * d + m;
      y[i * kQK4_1 + j + kQK4_1 / 2] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

void quant_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[i * kQK8_0 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(std::lround(x[i * kQK8_0 + j] * id));
  }
}

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK4_0; ++j) {
      const float v = x[i * kQK4_0 + j];
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const float x0 = x[i * kQK4_0 + j] * id;
      const float x1 = x[i * kQK4_0 + kQK4_0 / 2 + j] * id;
      const uint8_t q0 = static_cast<uint8_t>(std::min(15, static_cast<int>(x0 + 8.5f)));
      const uint8_t q1 = static_cast<uint8_t>(std::min(15, static_cast<int>(x1 + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    float min = x[i * kQK4_1], max = x[i * kQK4_1];
    for (int j = 1; j < kQK4_1; ++j) {
      min = std::min(min, x[i * kQK4_1 + j]);
      max = std::max(max, x[i * kQK4_1 + j]);
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const float x0 = (x[i * kQK4_1 + j] - min) * id;
      const float x1 = (x[i * kQK4_1 + kQK4_1 / 2 + j] - min) * id;
      const uint8_t q0 = static_cast<uint8_t>(std::min(15, static_cast<int>(x0 + 0.5f)));
      const uint8_t q1 = static_cast<uint8_t>(std::min(15, static_cast<int>(x1 + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

}  // namespace

bool can_dequantize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      return true;
    default:
      return false;
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t nb = n / dtype_info(t).block_size;
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kQ4_0:
      return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::kQ4_1:
      return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case DType::kQ8_0:
      return dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    default:
      throw_unsupported("no dequantizer for tensor type " + std::string(dtype_name(t)));
  }
}

bool can_quantize(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kQ8_0 || t == DType::kQ4_0 ||
         t == DType::kQ4_1;
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const int64_t nb = n / dtype_info(t).block_size;
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
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
    case DType::kQ8_0:
      return quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::kQ4_0:
      return quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::kQ4_1:
      return quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    default:
      throw_unsupported("no quantizer for tensor type " + std::string(dtype_name(t)));
  }
}

}  // namespace servetune
