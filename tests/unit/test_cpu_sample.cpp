// CpuBackend::sample (rows split over the thread pool) against the host Sampler: the checks of
// backend_sample_checks.h on one thread and on three.
#include "backend_sample_checks.h"

namespace servetune {
namespace {

std::unique_ptr<Backend> cpu_one_thread(std::string&) { return make_backend("cpu", 1); }
std::unique_ptr<Backend> cpu_three_threads(std::string&) { return make_backend("cpu", 3); }

INSTANTIATE_TEST_SUITE_P(Cpu, BackendSample, ::testing::Values(&cpu_one_thread, &cpu_three_threads));

}  // namespace
}  // namespace servetune
