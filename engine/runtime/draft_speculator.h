// Draft-model speculation: a second, smaller model with the target's vocabulary, its own paged KV cache and block
// manager, on the target's backend. Per step it catches up on the tokens each request has that its cache lacks
// (prompt on the first step, accepted tokens later; batched across requests, chunked to the token budget), then
// runs one batched decode step per draft token. Greedy requests get argmax drafts; sampled requests get drafts
// drawn from q (the draft's tempered, top-k/top-p/min-p filtered distribution), returned for verification.
// Invariant: a tracked sequence's draft KV holds exactly tokens[0, num_computed) of what it last proposed from.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/block_manager.h"
#include "runtime/scheduler.h"
#include "runtime/speculator.h"

namespace servetune {

class Checkpoint;
class KvStorage;
class Model;
class ModelRunner;

class DraftModelSpeculator final : public Speculator {
 public:
  // Loads the model at `draft_path` on context.backend. Error(kUsage) naming both files when its vocabulary (size
  // or any token's spelling) differs from the target's (`target_path`).
  DraftModelSpeculator(const std::string& draft_path, const std::string& target_path, const SpeculatorContext& context);
  ~DraftModelSpeculator() override;

  void propose(std::span<const DraftSlot> slots) override;
  void rollback(int64_t seq_id, std::span<const int32_t> tokens) override;
  void release(int64_t seq_id) override;
  int64_t kv_blocks_used() const override { return blocks_->num_used_blocks(); }
  const char* name() const override { return "draft"; }

  // For tests: the draft cache's bookkeeping and the number of requests holding draft state.
  const BlockManager& blocks() const { return *blocks_; }
  size_t num_tracked() const { return states_.size(); }

 private:
  struct State {
    Sequence seq;  // tokens: the request's tokens plus drafts fed back; num_computed: tokens in the draft KV
    std::mt19937_64 rng;
  };
  struct Active;
  // Points `st` at the request's `tokens`, keeping draft K/V only for their common prefix (at most all but the last).
  void sync(State& st, std::span<const int32_t> tokens);
  void append_draft(Active& a, std::span<const float> logits);

  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvStorage> kv_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<ModelRunner> runner_;
  int64_t vocab_ = 0;
  int64_t context_length_ = 0;
  int64_t max_batch_tokens_ = 0;
  std::unordered_map<int64_t, State> states_;
  std::vector<float> q_;  // scratch
};

// The distribution a sampled request's draft token is drawn from: softmax(logits / temperature) with top-k, top-p
// and min-p applied as the sampler applies them (no penalties: any q is lossless, a closer one is accepted more).
void draft_distribution(std::span<const float> logits, const SamplingParams& params, std::vector<float>& q);
// A draft head's next token from its `logits`: the argmax for a greedy request; for a sampled one drawn with `rng` from
// q (draft_distribution, in scratch `q`), whose row is appended to `draft_probs` for verification.
// A draft cache's catch-up forward, one sequence: schedules as many of `seq`'s uncomputed tokens as `budget` leaves
// (taken from it) into `step`, its blocks allocated, or sets `stopped` when the cache has no blocks for them.
// Returns whether the step reaches the sequence's last token (its logits give the first draft).
bool schedule_catch_up(Sequence& seq, BlockManager& blocks, int64_t& budget, SchedulerOutput& step, bool& stopped);
int32_t draw_draft_token(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng,
                         std::vector<float>& q, std::vector<float>& draft_probs);

}  // namespace servetune
