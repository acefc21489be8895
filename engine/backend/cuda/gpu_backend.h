// Entry point of the GPU backend (CUDA, or HIP through gpu_shim.h) for the backend factory; plain C++, no GPU headers.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "servetune/device_probe.h"

namespace servetune {

// "cuda" or "hip": the device name this build's GPU backend answers to.
const char* gpu_backend_name();
// Chunks per token the GPU attention splits this call into on device 0 (1: the single-pass kernel); for tests.
int64_t gpu_attention_chunks(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads);
// Whether the GPU attention takes this call on tensor cores (prefill_attention_mma.cu: f16/bf16 Q and P, so within
// their rounding of the CPU reference rather than 1e-5); for tests.
bool gpu_attention_tensor_cores(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads);
// Number of GPUs the runtime sees (0 when there is no device or no driver).
int gpu_device_count();
// The GPU backend on device 0; Error(kUnsupported) when no GPU is present.
std::unique_ptr<Backend> make_gpu_backend();
// Device 0's memory, copy-kernel bandwidth and bf16 GEMM rate (cuBLAS; the HIP build: the tiled kernel), timed with
// events on the device (peaks.cu); the caller has checked that a GPU is visible.
DeviceProbe probe_gpu();

}  // namespace servetune
