// SIMD rotary embedding (runtime-dispatched): ops_reference.h's rope_heads, bit for bit. The per-ISA files are built
// with -ffp-contract=off so no product is fused into an FMA the reference does not do.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace servetune::cpu::detail {

// Rotates the first p.rope_dim dims of each of the n_heads heads at x (p.head_dim apart) by one position's
// cos_sin (ref::rope_cache's layout); the other dims are left as they are.
void rope_heads_avx512(float* x, int64_t n_heads, const float* cos_sin, const RopeParams& p);
void rope_heads_avx2(float* x, int64_t n_heads, const float* cos_sin, const RopeParams& p);

}  // namespace servetune::cpu::detail
