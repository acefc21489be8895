// probe_device (servetune/device_probe.h): the cpu measured here (memcpy, the CPU backend's bf16 matmul); GPUs in
// cuda/peaks.cu. Only this file and backend.cpp see SERVETUNE_WITH_GPU.
#include "servetune/device_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/half.h"
#include "core/host_memory.h"
#if defined(SERVETUNE_WITH_GPU)
#include "backend/cuda/gpu_backend.h"
#endif

namespace servetune {
namespace {

// Best wall time of `runs` calls of fn, in seconds.
template <class F>
double best_seconds(int runs, F&& fn) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

DeviceProbe probe_cpu(int threads) {
  DeviceProbe p;
  p.device = "cpu";
  p.name = "host CPU, " + std::string(cpu_isa_name(cpu_selected_isa())) + " kernels";
  p.total_bytes = physical_host_memory();
  p.free_bytes = available_host_memory();

  // Larger than any last-level cache, small enough for a CI machine; pages touched before timing.
  const size_t bytes = size_t{128} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double copy_s = best_seconds(5, [&] { std::memcpy(dst.data(), src.data(), bytes); });
  p.copy_buffer_bytes = static_cast<int64_t>(bytes);
  p.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / copy_s;
  p.copy_what = "memcpy, one thread, best of 5";

  // The engine's own bf16 matmul (bf16 weights, f32 activations): what the CPU backend's GEMM path reaches.
  const int64_t rows = 2048, cols = 2048, n = 128;
  std::vector<uint16_t> w(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) * 1e-5f);
  std::vector<float> x(static_cast<size_t>(n * cols), 0.01f), y(static_cast<size_t>(n * rows));
  std::unique_ptr<Backend> cpu = make_backend("cpu", threads);
  const WeightMatrix wm{w.data(), DType::kBF16, rows, cols, cols * 2};
  const double gemm_s = best_seconds(3, [&] { cpu->matmul(wm, nullptr, x.data(), n, y.data()); });
  p.gemm_flops = 2.0 * static_cast<double>(rows * cols * n) / gemm_s;
  p.gemm_what = "CPU backend matmul, bf16 weights " + std::to_string(rows) + "x" + std::to_string(cols) + ", " +
                std::to_string(n) + " f32 rows, best of 3";
  return p;
}

}  // namespace

DeviceProbe probe_device(Device device, int threads) {
  if (device == Device::kCpu) return probe_cpu(threads);
#if defined(SERVETUNE_WITH_GPU)
  if (to_string(device) == gpu_backend_name()) {
    if (gpu_device_count() == 0) {
      throw_unsupported("device '" + to_string(device) + "': no GPU is visible to the " + gpu_backend_name() + " runtime");
    }
    return probe_gpu();
  }
#endif
  throw_unsupported("device '" + to_string(device) + "' is not available in this build (available: " +
                    available_backends() + ")");
}

}  // namespace servetune
