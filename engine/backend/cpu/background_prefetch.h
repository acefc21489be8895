// Memory the next operation will read, fetched toward the cores while the current matmuls compute: a list of byte
// ranges shared out between the pool's threads, each thread fetching a few cache lines of its share per call of
// background_prefetch_step() from inside the matmul tiles (spread out, so the fetches never queue up on the core's
// miss buffers). Performance only: nothing here changes a result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace servetune::cpu {

struct PrefetchRange {
  const char* begin;
  int64_t bytes;
};

// One thread's walk over its share of the ranges (every `stride`-th one, from its index). index >= count: done.
struct alignas(64) PrefetchCursor {
  const PrefetchRange* ranges = nullptr;
  int64_t count = 0;
  int64_t index = 0;
  int64_t offset = 0;
  int64_t stride = 1;
};

class BackgroundPrefetch {
 public:
  // Replaces the ranges and restarts every thread's walk (call between operations, never while the pool runs).
  void publish(std::vector<PrefetchRange> ranges, int n_threads);
  // Stops all fetching (the operation the ranges were for has started).
  void clear();
  // Thread `thread`'s walk; null past the thread count published.
  PrefetchCursor* cursor(int thread) {
    return static_cast<size_t>(thread) < cursors_.size() ? &cursors_[static_cast<size_t>(thread)] : nullptr;
  }
  bool active() const { return !ranges_.empty(); }

 private:
  std::vector<PrefetchRange> ranges_;
  std::vector<PrefetchCursor> cursors_ = std::vector<PrefetchCursor>(1);
};

// The K and V cache rows attention() reads for `batch` (each sequence once, up to its last position in the batch),
// one range per sequence, block and cache, in order, until at least max_bytes are listed. A K range is its whole
// block (K is transposed within pages, kv_layout.h, and the block's next positions are stored there before the
// attention); a V range ends at the sequence's last position.
std::vector<PrefetchRange> attention_cache_ranges(const KvLayerView& kv, const AttentionBatch& batch,
                                                  int64_t max_bytes);

// Fetches the next few lines of the cursor's share into L2 (prefetcht2); nearly free when the walk is done or c is
// null. Internal linkage: safe to call from any ISA's translation unit.
static inline void background_prefetch_step(PrefetchCursor* c) {
  constexpr int kLinesPerStep = 4;
  if (c == nullptr || c->index >= c->count) return;
  for (int i = 0; i < kLinesPerStep; ++i) {
    const PrefetchRange& r = c->ranges[c->index];
    __builtin_prefetch(r.begin + c->offset, 0, 1);
    c->offset += 64;
    if (c->offset >= r.bytes) {
      c->offset = 0;
      c->index += c->stride;
      if (c->index >= c->count) return;
    }
  }
}

}  // namespace servetune::cpu
