// What a device can do, measured on it: its memory, a copy's bandwidth and a bf16 GEMM's rate, so the device check
// (scripts/device-check.sh, `servetune probe-device`) reports utilisation against this machine rather than a
// datasheet, and sizes its KV cache and batches from the memory that is actually free.
#pragma once

#include <cstdint>
#include <string>

#include "servetune/engine_setting_enums.h"

namespace servetune {

struct DeviceProbe {
  std::string device;            // "cpu", "cuda" or "hip"
  std::string name;              // the GPU's name, or "host CPU, <ISA> kernels"
  int64_t total_bytes = 0;       // device memory (the cpu: physical RAM)
  int64_t free_bytes = 0;        // free now (the cpu: MemAvailable)
  int64_t copy_buffer_bytes = 0;  // size of the buffer the copy moved
  double copy_bytes_per_s = 0;   // bytes read plus bytes written per second by a device-to-device copy kernel (the
                                 // cpu: memcpy on one thread); best of several runs
  std::string copy_what;         // how it was measured
  double gemm_flops = 0;         // 2*m*n*k per second of a bf16 GEMM with f32 accumulation; best of several runs
  std::string gemm_what;         // which GEMM, and its shape
  double fp8_gemm_flops = 0;     // the engine's block-scaled FP8 matmul (CUDA sm_90 only; else 0), 2*m*n*k per second
  std::string fp8_gemm_what;
};

// Measures `device` (the cpu with `threads` pool threads, 0 = all cores; a GPU: device 0), a second or two of work.
// Throws Error(kUnsupported) for a device this build has no backend for, or when no GPU is visible.
DeviceProbe probe_device(Device device, int threads);

}  // namespace servetune
