// Avx2 instantiation of the activations (see activation_impl.h).
#include "backend/cpu/activation_impl.h"
#include "backend/cpu/activation_simd.h"
#include "backend/cpu/simd_avx2.h"

namespace servetune::cpu::detail {

void silu_mul_f32_avx2(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) {
  activation_impl::silu_mul<simd::Avx2>(gate, up, in_stride, n, ffn, out);
}

}  // namespace servetune::cpu::detail
