// Continuous-batching scheduler: each step spends a token budget on running sequences first (decode tokens and
// the next chunk of unfinished prefills), then admits waiting sequences by policy (fcfs, or lpm: longest cached
// prefix first), chunking long prompts. When KV blocks run out it preempts the newest running sequence by
// recompute. A decoding sequence with speculative drafts runs 1 + k tokens (the drafts appended to its tokens for
// the step); complete() leaves the drafts uncomputed and accept_draft() keeps the verified ones and rolls back the
// rest, so the prefix cache never sees a rejected token. Depends only on Sequence and BlockManager (tested without
// a model).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "runtime/block_manager.h"
#include "runtime/sequence.h"
#include "servetune/engine_setting_enums.h"  // SchedulePolicy

namespace servetune {

struct SchedulerConfig {
  int64_t max_running_requests = 256;
  int64_t max_batched_tokens = 8192;  // token budget of one step
  int64_t chunked_prefill_size = 2048;  // most prefill tokens of one sequence per step; <= 0: no chunking
  SchedulePolicy policy = SchedulePolicy::kFcfs;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t num_tokens = 0;  // tokens [seq->num_computed, seq->num_computed + num_tokens) run this step
  bool samples = false;    // the step reaches the sequence's last token, so it yields a new one
  int64_t num_draft = 0;   // of num_tokens, the trailing speculative draft tokens (verified after the forward)
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  std::vector<Sequence*> preempted;  // moved back to waiting this step (their KV was released)
  int64_t num_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager& blocks);

  void add(Sequence* seq);     // joins the waiting queue
  void remove(Sequence* seq);  // leaves any queue and releases its blocks (finish, abort)
  SchedulerOutput schedule();
  // Marks the scheduled tokens computed (drafts excepted) and registers completed blocks with the prefix cache.
  void complete(const SchedulerOutput& out);
  // After verification of a sequence's drafts: `accepted` of them become computed (their K/V is kept) and blocks
  // past the sequence's tokens are released. The caller has already cut `tokens` to the kept ones (context,
  // accepted drafts, and the token sampled after them), so rejected drafts are gone before anything is hashed.
  void accept_draft(Sequence* seq, int64_t accepted);

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  const SchedulerConfig& config() const { return config_; }

 private:
  int64_t prefill_limit(int64_t remaining, int64_t budget) const;
  void preempt(Sequence* seq, SchedulerOutput& out);
  void order_waiting();

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::vector<Sequence*> running_;
  std::deque<Sequence*> waiting_;
};

}  // namespace servetune
