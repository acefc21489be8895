// ISA dispatch of vector_math.h.
#include "backend/cpu/vector_math.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/activation_simd.h"
#include "backend/cpu/lane_sums.h"
#include "core/cpu_features.h"
#include "core/error.h"
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

int64_t argmax_first(std::span<const float> x) {
  const auto n = static_cast<int64_t>(x.size());
  switch (cpu_selected_isa()) {
    case CpuIsa::kAvx512: return detail::argmax_first_avx512(x.data(), n);
    case CpuIsa::kAvx2: return detail::argmax_first_avx2(x.data(), n);
    default: return std::max_element(x.begin(), x.end()) - x.begin();
  }
}

void exp_scaled_blocks(std::span<const float> x, float shift, float scale, std::span<float> out,
                       std::span<double> sums) {
  const auto n = static_cast<int64_t>(x.size());
  if (out.size() != x.size() || static_cast<int64_t>(sums.size()) != (n + kSumBlock - 1) / kSumBlock) {
    throw Error(ErrorKind::kInternal, "exp_scaled_blocks: output sizes do not match the input");
  }
  switch (cpu_selected_isa()) {
    case CpuIsa::kAvx512: return detail::exp_scaled_blocks_avx512(x.data(), n, shift, scale, out.data(), sums.data());
    case CpuIsa::kAvx2: return detail::exp_scaled_blocks_avx2(x.data(), n, shift, scale, out.data(), sums.data());
    default: break;
  }
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = std::exp((x[static_cast<size_t>(i)] - shift) * scale);
  for (int64_t b0 = 0; b0 < n; b0 += kSumBlock) {
    sums[static_cast<size_t>(b0 / kSumBlock)] = lane_block_sum(out.data() + b0, std::min(kSumBlock, n - b0));
  }
}

size_t collect_at_least(std::span<const float> w, std::span<const float> x, float theta, float floor, int32_t* ids,
                        double* mass) {
  if (w.size() != x.size()) throw Error(ErrorKind::kInternal, "collect_at_least: w and x differ in size");
  const auto n = static_cast<int64_t>(x.size());
  switch (cpu_selected_isa()) {
    case CpuIsa::kAvx512:
      return static_cast<size_t>(detail::collect_at_least_avx512(w.data(), x.data(), n, theta, floor, ids, mass));
    case CpuIsa::kAvx2:
      return static_cast<size_t>(detail::collect_at_least_avx2(w.data(), x.data(), n, theta, floor, ids, mass));
    default: break;
  }
  size_t count = 0;
  *mass = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (w[i] >= theta && x[i] >= floor) {
      ids[count++] = static_cast<int32_t>(i);
      *mass += static_cast<double>(w[i]);
    }
  }
  return count;
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
