// Speculative decoding: a Speculator proposes draft tokens for all speculating requests of a step in one batched
// call; verify_draft() checks them against the target's logits at the 1 + k verified positions (one forward),
// losslessly. Invariant: verification emits exactly what plain decoding would in distribution (greedy: token for
// token). Speculators see token ids and sampling settings, never a Request.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "runtime/sampler.h"

namespace servetune {

struct EngineConfig;
class Backend;
class Checkpoint;
class Tokenizer;

// One decoding request that may speculate this step.
struct DraftSlot {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;      // the request's tokens (prompt + output); the draft continues after the last
  int64_t max_tokens = 0;               // most draft tokens it can take (0: none this step; a draft head that reads
                                        // the target's hidden states still catches up on them)
  const SamplingParams* sampling = nullptr;  // greedy requests get deterministic drafts, sampled ones drafts drawn from q
  uint64_t seed = 0;                    // seeds the request's draft draws (first call for a seq_id)
  std::vector<int32_t>* draft = nullptr;      // out: the proposed tokens (cleared first; may stay empty)
  std::vector<float>* draft_probs = nullptr;  // out: [draft.size() x vocab] q rows the drafts were drawn from,
                                              // or empty for deterministic drafts (q = one-hot)
  std::vector<int32_t>* draft_parents = nullptr;  // out (tree drafters): Sequence::draft_parents, or empty for a chain
};

class Speculator {
 public:
  virtual ~Speculator() = default;
  // Proposes drafts for every slot (batched: a draft model runs one forward per draft step for all of them).
  virtual void propose(std::span<const DraftSlot> slots) = 0;
  // After verification the request `seq_id` holds `tokens`: state past them (draft K/V of rejected drafts) goes.
  virtual void rollback(int64_t /*seq_id*/, std::span<const int32_t> /*tokens*/) {}
  // The request finished, was aborted or preempted: every resource held for it is released.
  virtual void release(int64_t /*seq_id*/) {}
  // Forgets what its own cache shares between requests (with the engine's prefix-cache flush).
  virtual void flush_cache() {}
  // KV blocks the speculator's own cache has in use (0 without one).
  virtual int64_t kv_blocks_used() const { return 0; }
  // Draft heads that continue from the target's hidden states (MTP) want them for every position the target
  // computes: the step loop has the model keep them (Batch::return_hidden) and hands each sequence's rows over.
  virtual bool wants_hidden() const { return false; }
  // `rows` [count x hidden]: the target's final hidden states at positions first_position .. + count - 1 of `seq_id`
  // (a prefill chunk, or a verify step's positions, whose rejected ones the rollback() after it drops).
  virtual void target_hidden(int64_t /*seq_id*/, int64_t /*first_position*/, std::span<const float> /*rows*/) {}
  virtual const char* name() const = 0;
};

// Prompt lookup over the request's own tokens: the longest suffix n-gram (max_n down to min_n) that occurred
// earlier proposes the tokens that followed its most recent earlier occurrence. Drafts are deterministic.
class NgramSpeculator final : public Speculator {
 public:
  NgramSpeculator(int64_t min_n, int64_t max_n);
  void propose(std::span<const DraftSlot> slots) override;
  // Writes up to `max_tokens` draft tokens continuing `context` into `out` (cleared first; may stay empty).
  void propose(std::span<const int32_t> context, int64_t max_tokens, std::vector<int32_t>& out) const;
  const char* name() const override { return "ngram"; }

 private:
  int64_t min_n_, max_n_;
};

// What a draft-model speculator shares with the target: its backend (threads), its tokenizer and vocabulary (the
// draft's must be the same), and the KV cache geometry (the draft gets the same token capacity).
struct SpeculatorContext {
  Backend* backend = nullptr;
  const Tokenizer* target_tokenizer = nullptr;
  int64_t target_vocab = 0;
  int64_t kv_tokens = 0;
  int64_t page_size = 16;
  DType kv_dtype = DType::kF32;  // the target's KV cache element type, which the draft's cache uses too
  int64_t max_batch_tokens = 8192;  // most tokens of one draft forward (prompt catch-up is chunked to it)
  const Checkpoint* target = nullptr;  // the target's checkpoint (its MTP layers are draft heads)
  bool target_hidden = false;          // the target model returns its hidden states (Model::supports_hidden)
  bool prefix_caching = false;         // the target shares prefix blocks (a draft head's cache does too)
};

// The speculator a (validated) config asks for; nullptr without speculation. `draft` loads
// config.speculative_draft_model (Error naming both files when its vocabulary differs from the target's).
// `mtp` (or `eagle` without a draft model) runs the target's own multi-token-prediction layer (DraftHeadSpeculator);
// Error(kUnsupported) for EAGLE draft heads of other models, which are not implemented yet.
std::unique_ptr<Speculator> make_speculator(const EngineConfig& config, const SpeculatorContext& context);
// Draft tokens per step the config asks for (the most a request verifies): ngram: speculative_num_draft_tokens
// (default 4); draft: speculative_num_steps (default 4, or speculative_num_draft_tokens - 1 when only that is given,
// SGLang's rule); eagle / mtp: the same rule with SGLang's DeepSeek default of 3 steps, and with topk > 1 (a tree)
// speculative_num_draft_tokens - 1 nodes (default 8 - 1, SGLang's llama default).
int64_t speculative_draft_tokens(const EngineConfig& config);
// Draft forwards per step (speculative_num_steps; defaults as above, 5 for trees); ngram: its draft tokens.
int64_t speculative_draft_steps(const EngineConfig& config);

// Verifies `draft` (k tokens) against logits rows 0..k (row j: the target's logits after the context plus
// draft[0..j)). Per row: banned() gives the tokens the sampler must not pick, the sampler draws with the draft
// token as candidate (greedy: argmax; sampling: accept with min(1, p(d)/q(d)), else draw from max(0, p - q)
// renormalised, where q is row j of `draft_probs` [k x vocab], or one-hot at d when `draft_probs` is empty), the
// sampler records the token (penalties), and emit(result) streams it and returns true when the request is finished.
// With an empty draft this is one plain sampling step. Stops at the first rejection
// (whose replacement token is emitted), at a finish, or after the bonus token of row k.
// Returns the number of draft tokens accepted and emitted (their K/V stays valid).
int64_t verify_draft(Sampler& sampler, std::span<const int32_t> draft, const std::function<std::span<float>(size_t)>& row,
                     const std::function<std::vector<int32_t>()>& banned, const std::function<bool(SampleResult&)>& emit,
                     std::span<const float> draft_probs = {});

// Verifies a draft tree: `draft` nodes with `parents` (Sequence::draft_parents), logits row 0 after the context, row
// 1 + i after node i. From the root, each row's token is drawn by Sampler::sample_siblings over the node's children;
// a matching child is accepted and the walk goes on from it, otherwise the drawn token ends the step (as does a
// finish, or a leaf's bonus token). Returns the accepted nodes' indices, root to leaf (their K/V stays valid once
// moved to consecutive positions).
std::vector<int32_t> verify_tree(Sampler& sampler, std::span<const int32_t> draft, std::span<const int32_t> parents,
                                 const std::function<std::span<float>(size_t)>& row,
                                 const std::function<std::vector<int32_t>()>& banned,
                                 const std::function<bool(SampleResult&)>& emit);

}  // namespace servetune
