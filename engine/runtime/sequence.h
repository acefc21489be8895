// The runtime's view of one request's tokens and KV blocks: what the scheduler and the block manager work on.
// Invariant: tokens[0, num_computed) have their K/V in the cache through block_table; num_computed <= size().
// Speculative drafts live in `draft` until the scheduler appends the ones it schedules to `tokens` for one step.
#pragma once

#include <cstdint>
#include <vector>

namespace servetune {

enum class SeqStatus { kWaiting, kRunning, kFinished };

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int64_t prompt_len = 0;
  int64_t max_total_len = 0;    // prompt_len + max_tokens: the most KV this sequence can ever need
  int64_t num_computed = 0;     // tokens whose KV is cached
  int64_t num_prefix_hit = 0;   // prompt tokens served from the prefix cache at the last admission
  std::vector<int32_t> block_table;
  std::vector<uint64_t> block_hashes;  // chained hashes of the full blocks registered so far (prefix of block_table)
  SeqStatus status = SeqStatus::kWaiting;
  int64_t arrival = 0;          // submission order, for fcfs
  int64_t num_preemptions = 0;
  std::vector<int32_t> draft;   // proposed speculative tokens for the next decode step (not in tokens)
  // A draft tree (empty: a chain): draft_parents[i] is the index in `draft` of draft i's parent, or -1 for the
  // sequence's last token; parents come first. Kept, cut to the scheduled drafts, until they are verified.
  std::vector<int32_t> draft_parents;
  // Request::prompt_logits: prompt positions [0, prompt_len - 1) return their logits; those before
  // prompt_logits_done have (a recompute after preemption does not return them again). No prefix-cache reuse.
  bool prompt_logits = false;
  int64_t prompt_logits_done = 0;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_uncomputed() const { return size() - num_computed; }
  bool in_prefill() const { return num_computed < size() - 1; }
};

}  // namespace servetune
