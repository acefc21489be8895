// Row-parallel sums and vocab-parallel logits gathers over a ParallelContext's communicator (see shard_collectives.h).
#include "model/shard_collectives.h"

#include <algorithm>

#include "comm/communicator.h"

namespace servetune {

void sum_partials(Backend& backend, const ParallelContext& parallel, float* partial, int64_t count) {
  if (parallel.tp_size == 1) return;
  backend.synchronize();
  parallel.comm->all_reduce(partial, static_cast<size_t>(count), ReduceOp::kSum);
}

void gather_vocab_logits(Backend& backend, const ParallelContext& parallel, int64_t vocab, const float* local, int64_t n_out,
                         std::vector<float>& gathered, std::vector<float>& logits) {
  backend.synchronize();
  const int tp = parallel.tp_size;
  std::vector<size_t> counts(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) counts[static_cast<size_t>(r)] = static_cast<size_t>(n_out * balanced_slice(vocab, tp, r).count);
  gathered.resize(static_cast<size_t>(n_out * vocab));
  parallel.comm->all_gatherv(local, gathered.data(), counts);
  logits.resize(gathered.size());
  const float* part = gathered.data();
  for (int r = 0; r < tp; ++r) {
    const SliceRange v = balanced_slice(vocab, tp, r);
    for (int64_t i = 0; i < n_out; ++i) {
      std::copy(part + i * v.count, part + (i + 1) * v.count, logits.begin() + i * vocab + v.begin);
    }
    part += n_out * v.count;
  }
}

}  // namespace servetune
