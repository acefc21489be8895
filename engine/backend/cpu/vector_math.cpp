// ISA dispatch of vector_math.h.
#include "backend/cpu/vector_math.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/activation_simd.h"
#include "core/cpu_features.h"
#include "core/half.h"

namespace servetune::cpu {

float max_value(std::span<const float> x) {
  const auto n = static_cast<int64_t>(x.size());
  switch (cpu_selected_isa()) {
    case CpuIsa::kAvx512: return detail::max_value_avx512(x.data(), n);
    case CpuIsa::kAvx2: return detail::max_value_avx2(x.data(), n);
    default: return *std::max_element(x.begin(), x.end());
  }
}

double exp_scaled(std::span<const float> x, float shift, float scale, std::span<float> out) {
  const auto n = static_cast<int64_t>(x.size());
  switch (cpu_selected_isa()) {
    case CpuIsa::kAvx512: return detail::exp_scaled_avx512(x.data(), n, shift, scale, out.data());
    case CpuIsa::kAvx2: return detail::exp_scaled_avx2(x.data(), n, shift, scale, out.data());
    default: break;
  }
  double total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = std::exp((x[i] - shift) * scale);
    total += out[i];
  }
  return total;
}

void to_f16(std::span<const float> x, uint16_t* out) {
  const auto n = static_cast<int64_t>(x.size());
  switch (cpu_selected_isa()) {
    case CpuIsa::kAvx512: return detail::to_f16_avx512(x.data(), n, out);
    case CpuIsa::kAvx2: return detail::to_f16_avx2(x.data(), n, out);
    default: break;
  }
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_fp16(x[i]);
}

void to_fp8_e4m3(std::span<const float> x, uint8_t* out) {
  const auto n = static_cast<int64_t>(x.size());
  switch (cpu_selected_isa()) {
    case CpuIsa::kAvx512: return detail::to_fp8_e4m3_avx512(x.data(), n, out);
    case CpuIsa::kAvx2: return detail::to_fp8_e4m3_avx2(x.data(), n, out);
    default: break;
  }
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_fp8_e4m3(x[i]);
}

}  // namespace servetune::cpu
