// The latent attention kernel built for avx2 (latent_attention_impl.h).
#include "backend/cpu/latent_attention_impl.h"
#include "backend/cpu/simd_avx2.h"

namespace servetune::cpu::detail {

void latent_attention_avx2(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1,
                           LatentAttentionScratch& scratch) {
  latent_attention_lanes<simd::Avx2>(item, t0, t1, h0, h1, 0, -1, nullptr, scratch);
}

void latent_partial_avx2(const LatentAttentionItem& item, int64_t t0, int64_t t1, int64_t h0, int64_t h1, int64_t block,
                      float* partial, LatentAttentionScratch& scratch) {
  latent_attention_lanes<simd::Avx2>(item, t0, t1, h0, h1, block * kLatentPositionBlock, (block + 1) * kLatentPositionBlock,
                                   partial, scratch);
}

}  // namespace servetune::cpu::detail
