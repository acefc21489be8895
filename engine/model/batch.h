// The model's only input: a flattened batch of tokens from many sequences (varlen), with per-token positions,
// per-token KV slots, and per-sequence block tables. The model never sees a Request.
// Invariants: tokens of one sequence are contiguous and ordered by position; slot_mapping[t] is the cache slot
// (block * page_size + offset) for position positions[t]; every position < positions[t] of that sequence is
// already in the cache or earlier in this batch.
#pragma once

#include <cstdint>
#include <vector>

namespace servetune {

struct Batch {
  std::vector<int32_t> tokens;        // [n_tokens]
  std::vector<int32_t> positions;     // [n_tokens]
  std::vector<int32_t> seq_of_token;  // [n_tokens] index into the per-sequence arrays
  std::vector<int32_t> slot_mapping;  // [n_tokens]
  std::vector<int32_t> block_tables;  // [n_seqs * max_blocks_per_seq], unused entries -1
  int64_t max_blocks_per_seq = 0;
  std::vector<int32_t> logits_indices;  // token rows whose logits are returned, in output order
  // Keep every token's final normalised hidden state (Model::hidden_rows): what draft heads (MTP) continue from.
  bool return_hidden = false;
  // [n_tokens, hidden]: a next-n (MTP) layer's second input per token, the target's hidden state at that position.
  std::vector<float> input_hidden;
  // Draft-tree tokens (speculative verification; empty: none): per token, 0 for an ordinary causal token, else the
  // ancestor bitmask over its sequence's tree, whose node i sits at cache index tree_base[t] + i (AttentionBatch).
  std::vector<int32_t> tree_base;
  std::vector<uint64_t> tree_mask;

  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  bool has_tree() const { return !tree_mask.empty(); }
  int64_t n_seqs() const { return max_blocks_per_seq == 0 ? 0 : static_cast<int64_t>(block_tables.size()) / max_blocks_per_seq; }
};

}  // namespace servetune
