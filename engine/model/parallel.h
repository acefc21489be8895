// Where a model shard sits in a tensor-parallel group; layers size and slice their weights from it.
#pragma once

#include <cstdint>

namespace servetune {

struct ParallelContext {
  int tp_rank = 0;
  int tp_size = 1;

  // The [begin, end) slice of `n` items this rank owns (n must divide evenly; checked by the loader).
  int64_t begin(int64_t n) const { return n / tp_size * tp_rank; }
  int64_t end(int64_t n) const { return n / tp_size * (tp_rank + 1); }
  int64_t local(int64_t n) const { return n / tp_size; }
};

}  // namespace servetune
