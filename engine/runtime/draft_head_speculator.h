// Draft-head speculation (SGLang's EAGLE, topk 1): the draft head is DeepSeek-V3's own multi-token-prediction layer
// (model/moe_decoder.h's next-n mode) or an EAGLE head (model/eagle_head.h), each with its own one-layer cache.
// Its input at position i is the request's token t_{i+1} and the target's final hidden state h_i, which the step loop
// hands over after every target forward (target_hidden); it predicts t_{i+2}. Per step it catches up on the positions
// the target computed since (prompt on the first step, accepted tokens later; batched, chunked to the token budget):
// the forward that reaches position n-2 of an n-token request yields its first draft; each further draft step feeds
// the last draft and the head's own output hidden state at the next position, as SGLang chains
// num_steps. Greedy requests get argmax drafts, sampled ones drafts drawn from q (draft_speculator.h).
// Invariants: a tracked sequence's MTP cache holds exactly positions [0, num_computed) computed from the target's
// hidden states and emitted tokens (the draft-step positions past them are truncated after each propose); hidden
// rows are kept only for target positions the cache has not consumed and that verification has not rejected.
// With prefix caching (context.prefix_caching) the head's own cache shares full blocks between requests, keyed by
// the head's input tokens t_1.. (t_0, BOS in chat prompts, is not in the key: a prompt differing only there could
// reuse rows computed for another, which costs acceptances, not correctness): a prefix the target reuses from its
// cache is usually in the head's too. Positions neither computed by the target here nor cached by the head have no
// hidden state: their rows are computed with h = 0 (lossless; fewer acceptances), counted in
// positions_without_hidden(), and never shared.
// Trees (topk > 1, SGLang's EAGLE-2 drafting; draft_tree.cpp): the first forward's top-k tokens are the root's
// children; each further step feeds the top-k of the newest candidates by cumulative draft probability (each at its
// parent's depth + 1, attending to its own ancestors: Batch::tree_mask) and adds their top-k children as candidates;
// the best num_nodes candidates (parents rank before children) are the drafts, deterministic for every request.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/batch.h"
#include "runtime/block_manager.h"
#include "runtime/speculator.h"

namespace servetune {

class KvStorage;
class Model;

// What a draft head proposes per step: num_steps head forwards; topk 1: a chain of num_steps tokens; topk > 1: a
// tree of num_nodes draft tokens (SGLang's speculative_num_draft_tokens - 1, the root not counted).
struct DraftTreeShape {
  int64_t num_steps = 1;
  int64_t topk = 1;
  int64_t num_nodes = 1;
};

class DraftHeadSpeculator final : public Speculator {
 public:
  // `head` (a Model reading Batch::input_hidden, on context.backend; shared so that it can keep the files it was
  // loaded from alive) drafts a chain or tree of `shape` per request and step; `name` is the algorithm's ("mtp", "eagle").
  DraftHeadSpeculator(std::shared_ptr<Model> head, const SpeculatorContext& context, const DraftTreeShape& shape,
                      const char* name);
  ~DraftHeadSpeculator() override;

  void propose(std::span<const DraftSlot> slots) override;
  void rollback(int64_t seq_id, std::span<const int32_t> tokens) override;
  void release(int64_t seq_id) override;
  int64_t kv_blocks_used() const override { return blocks_->num_used_blocks(); }
  void flush_cache() override { blocks_->flush_cached(); }
  bool wants_hidden() const override { return true; }
  void target_hidden(int64_t seq_id, int64_t first_position, std::span<const float> rows) override;
  const char* name() const override { return name_; }

  // For tests: the MTP cache's bookkeeping, the requests holding state, positions run without a hidden state.
  const BlockManager& blocks() const { return *blocks_; }
  size_t num_tracked() const { return states_.size(); }
  int64_t positions_without_hidden() const { return missing_hidden_; }

 private:
  struct State {
    Sequence seq;                // tokens[i] = the request's token i + 1; num_computed: positions in the MTP cache
    std::vector<float> hidden;   // the target's hidden states at positions [hidden_from, hidden_from + rows)
    int64_t hidden_from = 0;
    std::mt19937_64 rng;
    bool seeded = false;
    int64_t first_without_hidden = -1;  // the first cache position computed with h = 0 (-1: none): not shared
  };
  struct Active;
  int64_t hidden_rows(const State& st) const;
  // Appends position p's input hidden state (zeros when the target gave none) to batch_.input_hidden.
  void append_input(State& st, int64_t p);
  void catch_up(std::vector<Active>& active);
  void share_blocks(State& st);
  void draft_steps(std::vector<Active>& active);
  void forward(bool return_hidden);
  // Trees (draft_tree.cpp): the root's children from the first draft's logits, the expansion steps, the choice.
  void tree_root(Active& a, std::span<const float> logits, std::span<const float> hidden);
  void tree_steps(std::vector<Active>& active);
  void tree_select(Active& a) const;

  std::shared_ptr<Model> model_;
  const char* name_;
  std::unique_ptr<KvStorage> kv_;
  std::unique_ptr<BlockManager> blocks_;
  int64_t hidden_ = 0;
  int64_t num_steps_ = 1;
  int64_t topk_ = 1;
  int64_t num_nodes_ = 1;
  int64_t page_size_ = 16;
  int64_t context_length_ = 0;
  int64_t max_batch_tokens_ = 0;
  int64_t missing_hidden_ = 0;
  std::unordered_map<int64_t, State> states_;
  Batch batch_;
  std::vector<float> logits_, q_;  // scratch
};

}  // namespace servetune
