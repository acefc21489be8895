// Avx512 instantiation of the grouped attention kernel (see attention_group_impl.h).
#include "backend/cpu/attention_group_impl.h"
#include "backend/cpu/simd_avx512.h"

namespace servetune::cpu::detail {

void attention_group_avx512(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                            float scale, int64_t t0, int64_t t1, int64_t head_begin, int64_t head_count,
                            float* scratch, float* out) {
  attention_impl::attention_group<simd::Avx512>(kv, batch, q, n_heads, scale, t0, t1, head_begin, head_count, scratch, out);
}

}  // namespace servetune::cpu::detail
