// The backend factory: the CPU backend always, the GPU backend (CUDA or HIP, same sources) when the build has one.
#include "backend/backend.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/profiling_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#if defined(SERVETUNE_WITH_GPU)
#include "backend/cuda/gpu_backend.h"
#endif

namespace servetune {

void Backend::sample(const float*, int64_t, int64_t, std::span<const SampleRow>, int32_t*) {
  throw Error(ErrorKind::kInternal, "backend '" + name() + "' does not sample on the device (the host Sampler does)");
}

namespace {

[[noreturn]] void no_moe_op(const std::string& backend, const char* op) {
  throw_unsupported("the " + backend + " backend has no " + op +
                    " (mixture-of-experts and latent-attention models run on the cpu, cuda and hip backends)");
}

}  // namespace

void Backend::scatter_add_rows(const float*, const int32_t*, const float*, int64_t, int64_t, float*) {
  no_moe_op(name(), "scatter_add_rows");
}
void Backend::expert_mlps(std::span<const ExpertMlp>, const float*, float*) { no_moe_op(name(), "expert_mlps"); }
void Backend::group_by_expert(const MoeRouting&, const float*, const float*, int64_t, const int32_t*, int32_t*, float*,
                              int32_t*) {
  throw_unsupported("the " + name() + " backend does not route experts on the device (the model routes on the host)");
}
void Backend::expert_mlps_grouped(std::span<const ExpertWeights>, const int32_t*, int64_t, const float*, float*) {
  throw_unsupported("the " + name() + " backend has no expert_mlps_grouped (experts' rows come from the host)");
}
void Backend::head_matmul(const WeightMatrix&, int64_t, const float*, HeadStrides, int64_t, float*, HeadStrides) {
  no_moe_op(name(), "head_matmul");
}
void Backend::copy_rows(const float*, int64_t, float*, int64_t, int64_t, int64_t) { no_moe_op(name(), "copy_rows"); }
void Backend::store_latent(const KvLayerView&, const float*, int64_t, const float*, const int32_t*, int64_t) {
  no_moe_op(name(), "store_latent");
}
void Backend::attention_latent(const KvLayerView&, const AttentionBatch&, const float*, int64_t, int64_t, float, float*) {
  no_moe_op(name(), "attention_latent");
}

void Backend::copy_kv_slots(const KvLayerView&, const int32_t*, const int32_t*, int64_t) {
  throw_unsupported("the " + name() + " backend has no draft-tree verification (copy_kv_slots); speculative_eagle_topk > 1 "
                    "runs on device cpu");
}

std::string sample_row_problem(const SampleRow& r) {
  if (!(r.temperature >= 0.0f && r.temperature <= 100.0f) || !(r.top_p > 0.0f && r.top_p <= 1.0f) ||
      !(r.min_p >= 0.0f && r.min_p <= 1.0f) || !(r.uniform >= 0.0 && r.uniform <= 1.0)) {
    return "temperature " + std::to_string(r.temperature) + ", top_p " + std::to_string(r.top_p) + ", min_p " +
           std::to_string(r.min_p) + ", uniform " + std::to_string(r.uniform) + " out of range";
  }
  return "";
}

bool backend_available(const std::string& device) {
#if defined(SERVETUNE_WITH_GPU)
  if (device == gpu_backend_name()) return true;
#endif
  return device == "cpu";
}

std::string available_backends() {
#if defined(SERVETUNE_WITH_GPU)
  return std::string("cpu, ") + gpu_backend_name();
#else
  return "cpu";
#endif
}

namespace {

std::unique_ptr<Backend> make_device_backend(const std::string& device, int threads) {
  if (device == "cpu") {
    if (threads <= 0) threads = available_cpus();
    return std::make_unique<cpu::CpuBackend>(threads);
  }
#if defined(SERVETUNE_WITH_GPU)
  if (device == gpu_backend_name()) return make_gpu_backend();
#endif
  if (device == "cuda" || device == "hip") {
    throw_unsupported("device '" + device + "' needs the GPU build (cmake --preset " + device + "); this build has: " +
                      available_backends());
  }
  throw_unsupported("device '" + device + "' is not available in this build (available: " + available_backends() + ")");
}

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& device, int threads) {
  std::unique_ptr<Backend> backend = make_device_backend(device, threads);
  const char* profile = std::getenv("SERVETUNE_PROFILE_OPS");
  if (profile == nullptr || *profile == '\0') return backend;
  const std::string destination = profile;
  return std::make_unique<ProfilingBackend>(std::move(backend), destination == "1" ? "-" : destination);
}

}  // namespace servetune
