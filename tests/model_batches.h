// Batches for tests that drive a Model directly: one sequence's positions [begin, end) with logits for each,
// its KV blocks laid out in reverse so block tables are exercised.
#pragma once

#include <cstdint>
#include <vector>

#include "model/batch.h"

namespace servetune::testing {

inline Batch one_sequence(const std::vector<int32_t>& tokens, int begin, int end, int64_t page, int64_t blocks) {
  Batch b;
  for (int p = begin; p < end; ++p) {
    b.tokens.push_back(tokens[static_cast<size_t>(p)]);
    b.positions.push_back(p);
    b.seq_of_token.push_back(0);
    b.slot_mapping.push_back(static_cast<int32_t>((blocks - 1 - p / page) * page + p % page));  // blocks in reverse
    b.logits_indices.push_back(p - begin);
  }
  b.max_blocks_per_seq = blocks;
  for (int64_t i = 0; i < blocks; ++i) b.block_tables.push_back(static_cast<int32_t>(blocks - 1 - i));
  return b;
}

}  // namespace servetune::testing
