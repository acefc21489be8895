// Device sampling on the GPU backend against the host Sampler, and its refusal of non-finite logits (the checks are
// in backend_sample_checks.h). Skips, saying why, when no GPU is visible.
#include "backend/cuda/gpu_backend.h"
#include "backend_sample_checks.h"

namespace servetune {
namespace {

std::unique_ptr<Backend> gpu(std::string& skip_reason) {
  if (gpu_device_count() > 0) return make_backend(gpu_backend_name(), 1);
  skip_reason = std::string("no GPU visible to the ") + gpu_backend_name() + " runtime";
  return nullptr;
}

INSTANTIATE_TEST_SUITE_P(Gpu, BackendSample, ::testing::Values(&gpu));

}  // namespace
}  // namespace servetune
