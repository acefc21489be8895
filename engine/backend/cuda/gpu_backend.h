// Entry point of the GPU backend (CUDA, or HIP through gpu_shim.h) for the backend factory; plain C++, no GPU headers.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace servetune {

// "cuda" or "hip": the device name this build's GPU backend answers to.
const char* gpu_backend_name();
// Number of GPUs the runtime sees (0 when there is no device or no driver).
int gpu_device_count();
// The GPU backend on device 0; Error(kUnsupported) when no GPU is present.
std::unique_ptr<Backend> make_gpu_backend();

}  // namespace servetune
