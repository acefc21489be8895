// BackgroundPrefetch: the published ranges and each thread's cursor into them (see background_prefetch.h).
#include "backend/cpu/background_prefetch.h"

#include <algorithm>
#include <utility>

namespace servetune::cpu {

void BackgroundPrefetch::publish(std::vector<PrefetchRange> ranges, int n_threads) {
  ranges_ = std::move(ranges);
  cursors_.clear();
  for (int t = 0; t < n_threads; ++t) {
    cursors_.push_back({ranges_.data(), static_cast<int64_t>(ranges_.size()), t, 0, n_threads});
  }
}

std::vector<PrefetchRange> attention_cache_ranges(const KvLayerView& kv, const AttentionBatch& batch,
                                                  int64_t max_bytes) {
  std::vector<int64_t> visible;  // per sequence; a prefill chunk lists its sequence once per token
  for (int64_t t = 0; t < batch.n_tokens; ++t) {
    const auto seq = static_cast<size_t>(batch.seq_of_token[t]);
    if (seq >= visible.size()) visible.resize(seq + 1, 0);
    visible[seq] = std::max<int64_t>(visible[seq], attention_span(batch, t));
  }
  const int64_t slot_bytes = kv.n_kv_heads * kv.head_dim * static_cast<int64_t>(dtype_info(kv.dtype).type_size);
  std::vector<PrefetchRange> ranges;
  int64_t listed = 0;
  for (size_t seq = 0; seq < visible.size() && listed < max_bytes; ++seq) {
    const int32_t* table = batch.block_tables + static_cast<int64_t>(seq) * batch.max_blocks_per_seq;
    for (int64_t first = 0; first < visible[seq] && listed < max_bytes; first += kv.page_size) {
      const int64_t offset = static_cast<int64_t>(table[first / kv.page_size]) * kv.page_size * slot_bytes;
      // K is transposed within its page (kv_layout.h): a partly filled page spans the whole block.
      const int64_t k_bytes = kv.page_size * slot_bytes;
      const int64_t v_bytes = std::min(kv.page_size, visible[seq] - first) * slot_bytes;
      ranges.push_back({static_cast<const char*>(kv.k) + offset, k_bytes});
      ranges.push_back({static_cast<const char*>(kv.v) + offset, v_bytes});
      listed += k_bytes + v_bytes;
    }
  }
  return ranges;
}

void BackgroundPrefetch::clear() {
  for (PrefetchCursor& c : cursors_) c.count = 0;
  ranges_.clear();
}

}  // namespace servetune::cpu
