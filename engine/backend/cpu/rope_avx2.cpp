// Avx2 instantiation of the rotary embedding (see rope_impl.h); built with -ffp-contract=off.
#include "backend/cpu/rope_impl.h"
#include "backend/cpu/rope_simd.h"
#include "backend/cpu/simd_avx2.h"

namespace servetune::cpu::detail {

void rope_heads_avx2(float* x, int64_t n_heads, const float* cos_sin, const RopeParams& p) {
  rope_impl::rope_heads<simd::Avx2>(x, n_heads, cos_sin, p);
}

}  // namespace servetune::cpu::detail
