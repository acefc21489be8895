// One source, two vendors: maps the CUDA runtime names the kernels use onto HIP when SERVETUNE_HIP is defined
// (llama.cpp's approach), and gives the warp size (32 on NVIDIA, 64 on gfx90a) and a full-warp xor shuffle.
#pragma once

#include <string>

#if defined(SERVETUNE_HIP)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaSetDevice hipSetDevice
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemGetInfo hipMemGetInfo
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventDestroy hipEventDestroy
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaFreeHost hipHostFree
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphDestroy hipGraphDestroy
#define cudaGraphExecDestroy hipGraphExecDestroy
#define SERVETUNE_GPU_VENDOR "hip"
#define SERVETUNE_SHFL_XOR(v, mask) __shfl_xor((v), (mask))
constexpr int kWarpSize = 64;
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define SERVETUNE_GPU_VENDOR "cuda"
#define SERVETUNE_SHFL_XOR(v, mask) __shfl_xor_sync(0xffffffffu, (v), (mask))
constexpr int kWarpSize = 32;
#endif

namespace servetune::gpu {

// Throws Error(kInternal) naming the call and the runtime's message when `status` is not success.
void check(cudaError_t status, const char* what);
// Whether SERVETUNE_GPU_SYNC_CHECK or CUDA_LAUNCH_BLOCKING is set (not "0"): each op then waits for its work, so a
// kernel fault is reported against the op that caused it (gpu_backend.cu). Read once per process.
bool sync_check_enabled();

// Sum over each aligned group of kWidth lanes (a power of two up to the warp: by default the whole warp; float or
// double); every lane gets its group's sum. All lanes of the warp must call it.
template <int kWidth = kWarpSize, typename T>
__device__ inline T warp_sum(T v) {
  for (int mask = kWidth / 2; mask > 0; mask >>= 1) v += SERVETUNE_SHFL_XOR(v, mask);
  return v;
}

// bf16 / fp16 bit patterns to float and back (round to nearest even), without the vendors' header types.
__device__ inline float bf16_bits_to_f32(unsigned short h) { return __uint_as_float(static_cast<unsigned>(h) << 16); }
__device__ inline unsigned short f32_to_bf16_bits(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}
__device__ inline float fp16_bits_to_f32(unsigned short h) { return __half2float(__ushort_as_half(h)); }
__device__ inline unsigned short f32_to_fp16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

// OCP FP8 E4M3 codes (the FP8 KV cache) to float and back, bit for bit as core/half.h's fp8_e4m3_to_f32 and
// f32_to_fp8_e4m3 (round to nearest even, saturating at +-448, NaN kept), without the vendors' FP8 headers (ROCm 5.2
// has none).
__device__ inline float fp8_e4m3_bits_to_f32(unsigned char b) {
  const unsigned sign = static_cast<unsigned>(b & 0x80u) << 24, exp = (b >> 3) & 0x0Fu, man = b & 0x07u;
  if (exp == 0x0Fu && man == 0x07u) return __uint_as_float(sign | 0x7FC00000u);
  if (exp == 0) return __uint_as_float(sign | __float_as_uint(static_cast<float>(man) * 0x1p-9f));  // m * 2^-9
  return __uint_as_float(sign | (exp + 127u - 7u) << 23 | man << 20);
}
__device__ inline unsigned char f32_to_fp8_e4m3_bits(float f) {
  const unsigned u = __float_as_uint(f);
  const auto sign = static_cast<unsigned char>((u >> 24) & 0x80u);
  const unsigned a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;
  if (a >= 0x43E00000u) return sign | 0x7Eu;  // 448
  if (a < 0x3C800000u) {                       // below 2^-6: multiples of 2^-9
    const float quanta = __uint_as_float(a) * 512.0f;
    auto q = static_cast<unsigned>(quanta);
    const float rest = quanta - static_cast<float>(q);
    if (rest > 0.5f || (rest == 0.5f && (q & 1u) != 0)) ++q;
    return static_cast<unsigned char>(sign | q);
  }
  const unsigned rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
  return static_cast<unsigned char>(sign | ((rounded >> 20) - ((127u - 7u) << 3)));
}

}  // namespace servetune::gpu
