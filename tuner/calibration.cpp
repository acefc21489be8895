// The reference workload (see calibration.h).
#include "tuner/calibration.h"

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace servetune::tuner {
namespace {

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

}  // namespace

double calibration_ms() {
  constexpr size_t kBytes = size_t{64} << 20;
  static const std::vector<uint8_t> data = [] {
    std::vector<uint8_t> v(kBytes);
    uint32_t x = 12345;
    for (auto& b : v) {
      x = x * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(x >> 24);
    }
    return v;
  }();
  std::vector<double> times;
  volatile uint32_t sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = thread_cpu_ms();
    uint32_t acc[16] = {};
    for (size_t i = 0; i < kBytes; i += 16) {
      for (size_t j = 0; j < 16; ++j) acc[j] += static_cast<uint32_t>(data[i + j]) * static_cast<uint32_t>(j + 1);
    }
    uint32_t total = 0;
    for (uint32_t a : acc) total += a;
    sink = sink + total;
    times.push_back(thread_cpu_ms() - t0);
  }
  std::sort(times.begin(), times.end());
  return times[2];
}

}  // namespace servetune::tuner
