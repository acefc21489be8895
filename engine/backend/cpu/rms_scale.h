// The rms_norm scale of one row, shared by ref::rms_norm and the per-ISA builds (internal linkage: every translation
// unit compiles its own copy for its own ISA, so no vector instruction reaches a baseline unit through COMDAT).
#pragma once

#include <cmath>
#include <cstdint>

namespace servetune::cpu {
namespace {

// 1 / sqrt(mean(x²) + eps): ggml's sum of f32 squares in double, in eight independent partial sums (the rounding of
// a double sum of floats does not reach the f32 mean in practice, and the lanes avoid one long chain of dependent
// adds), the lanes then added in order.
inline float rms_scale(const float* x, int64_t dim, float eps) {
  double lane[8] = {};
  int64_t i0 = 0;
  for (; i0 + 8 <= dim; i0 += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(x[i0 + l] * x[i0 + l]);
  }
  for (; i0 < dim; ++i0) lane[0] += static_cast<double>(x[i0] * x[i0]);
  double sum = 0.0;
  for (double s : lane) sum += s;
  const float mean = static_cast<float>(sum / static_cast<double>(dim));
  return 1.0f / std::sqrt(mean + eps);
}

}  // namespace
}  // namespace servetune::cpu
