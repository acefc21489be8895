// The latent attention kernel built for avx512 (latent_attention_impl.h).
#include "backend/cpu/latent_attention_impl.h"

namespace servetune::cpu::detail {

void latent_attention_avx512(const LatentAttentionItem& item, int64_t t, int64_t h0, int64_t h1,
                           LatentAttentionScratch& scratch) {
  latent_attention_body(item, t, h0, h1, scratch);
}

}  // namespace servetune::cpu::detail
