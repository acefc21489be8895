// Where a model shard sits in a tensor-parallel group, and which part of each sharded dimension it owns.
// Attention is split by whole KV groups (a KV head and the query heads that read it), as evenly as they go; with
// fewer KV heads than ranks, each KV head is replicated on tp_size / n_kv_heads ranks that split its query heads.
#pragma once

#include <cstdint>

namespace servetune {

class Communicator;
struct ModelConfig;

// A contiguous [begin, begin + count) range of one dimension.
struct SliceRange {
  int64_t begin = 0;
  int64_t count = 0;
};

struct ParallelContext {
  int tp_rank = 0;
  int tp_size = 1;
  Communicator* comm = nullptr;  // the tensor-parallel group; required when tp_size > 1, not owned
};

// One rank's share of a model's sharded dimensions.
struct TensorParallelShare {
  SliceRange q_heads;   // query heads (rows of wq / cols of wo, in head_dim units)
  SliceRange kv_heads;  // KV heads stored and projected by this rank (replicated ones included)
  SliceRange ffn;       // gate/up rows, down cols
  SliceRange vocab;     // output-head rows (logits columns this rank computes)
};

// Splits `n` into `parts` contiguous ranges whose sizes differ by at most one; returns part `index`.
SliceRange balanced_slice(int64_t n, int parts, int index);

// The share of `rank` in a group of `tp_size`. Throws Error(kUsage) naming the numbers when the heads cannot be
// split (n_kv_heads neither >= tp_size nor a divisor of it, or a replicated KV head's query heads not dividing
// evenly) or the feed-forward dimension does not divide by tp_size.
TensorParallelShare tensor_parallel_share(const ModelConfig& config, int tp_size, int rank);

}  // namespace servetune
