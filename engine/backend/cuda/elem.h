// Element codes of the f32 / f16 / bf16 buffers the GPU kernels read and write (tables, KV caches; FP8 E4M3 for KV
// caches only), and their device loads and stores: one switch on a code the host picks from the DType, shared by
// ops.cu, attention.cu and latent.cu.
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_shim.h"
#include "core/dtype.h"

namespace servetune::gpu {

enum ElemCode : int { kElemF32 = 0, kElemF16 = 1, kElemBf16 = 2, kElemFp8 = 3 };

// The code of `t`; callers reject types other than f32, f16, bf16 (and for KV caches FP8 E4M3) before launching.
inline int elem_code(DType t) {
  return t == DType::kF16 ? kElemF16 : t == DType::kBF16 ? kElemBf16 : t == DType::kFP8_E4M3 ? kElemFp8 : kElemF32;
}

__device__ inline float load_elem(const void* base, int64_t i, int code) {
  if (code == kElemF16) return fp16_bits_to_f32(static_cast<const unsigned short*>(base)[i]);
  if (code == kElemBf16) return bf16_bits_to_f32(static_cast<const unsigned short*>(base)[i]);
  if (code == kElemFp8) return fp8_e4m3_bits_to_f32(static_cast<const unsigned char*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

// Round to nearest even for the narrow codes (FP8 saturating at +-448), as the CPU converters do.
__device__ inline void store_elem(void* base, int64_t i, int code, float v) {
  if (code == kElemF16) static_cast<unsigned short*>(base)[i] = f32_to_fp16_bits(v);
  else if (code == kElemBf16) static_cast<unsigned short*>(base)[i] = f32_to_bf16_bits(v);
  else if (code == kElemFp8) static_cast<unsigned char*>(base)[i] = f32_to_fp8_e4m3_bits(v);
  else static_cast<float*>(base)[i] = v;
}

}  // namespace servetune::gpu
