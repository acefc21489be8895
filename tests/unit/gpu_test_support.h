// Helpers of the GPU kernel tests: random inputs, bf16 rounding, the relative error against a CPU reference, and a
// fixture that owns the device copies it makes. Header-only; tests skip (saying why) when no GPU is visible.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gpu_backend.h"
#include "core/half.h"

namespace servetune::gpu_test {

#define SERVETUNE_REQUIRE_GPU()                                                                                   \
  do {                                                                                                            \
    if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU visible to the " << gpu_backend_name() << " runtime"; \
  } while (0)

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The floats `values` become as bf16 (round to nearest even), and their bit patterns.
inline std::vector<uint16_t> bf16_bits(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
  return bits;
}
inline std::vector<float> bf16_rounded(const std::vector<float>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = bf16_to_f32(f32_to_bf16(values[i]));
  return out;
}

// Largest |a - b| over the largest |b|.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0, scale = 1e-30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// A GPU backend and the device buffers a test made on it.
class GpuFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    SERVETUNE_REQUIRE_GPU();
    gpu_ = make_backend(gpu_backend_name(), 1);
  }
  // A device copy of host values, kept alive by the fixture.
  template <typename T>
  T* dev(const std::vector<T>& host) {
    buffers_.push_back(gpu_->allocate(std::max<size_t>(host.size() * sizeof(T), 1)));
    if (!host.empty()) gpu_->upload(*buffers_.back(), 0, host.data(), host.size() * sizeof(T));
    return static_cast<T*>(buffers_.back()->data());
  }
  // `n` values of type T copied back from a buffer dev() made (starting at its beginning).
  template <typename T = float>
  std::vector<T> host(const void* device, size_t n) {
    std::vector<T> out(n);
    for (const auto& b : buffers_) {
      if (b->data() == device) {
        gpu_->download(out.data(), *b, 0, n * sizeof(T));
        return out;
      }
    }
    ADD_FAILURE() << "host(): not a buffer this fixture made";
    return out;
  }

  std::unique_ptr<Backend> gpu_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

}  // namespace servetune::gpu_test
