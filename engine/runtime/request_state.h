// One request on a replica's engine thread, from enqueue to its final event: its sequence, sampler, output text and
// counters, and the token events it produces. Invariants: seq.tokens is the prompt then the accepted output tokens
// (plus, inside a step, the drafts scheduled for verification); the event with finish != kNone is the stream's last.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/output_text.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"
#include "servetune/engine.h"

namespace servetune {

class Tokenizer;

struct RequestState {
  // `seed` is the request's default sampling seed; requests stop at `context_length` tokens in all.
  RequestState(uint64_t id, const Tokenizer& tokenizer, int64_t context_length, const SamplingParams& params,
               uint64_t seed, std::vector<int32_t> prompt, std::shared_ptr<RequestStream> stream);

  // What this step's sampling produced: whether the request is finished, and how many of its drafts were accepted.
  struct Emitted {
    bool finished = false;
    int64_t accepted = 0;
    std::vector<int32_t> path;  // a draft tree's accepted nodes, root to leaf (empty for chains)
  };
  // Takes this step's tokens into `e` and the request: `device_token` (>= 0) drawn on the device, or sampled from
  // logits(0..num_draft), verifying the `num_draft` drafts at the end of seq.tokens (row j follows draft j), which
  // leave seq.tokens first; rejected ones stay out. Counts the verification in the request's spec counters.
  Emitted emit(int64_t num_draft, int32_t device_token, int64_t vocab,
               const std::function<std::span<float>(size_t)>& logits, TokenEvent& e);
  // The final event of a request ended by `reason` (abort or error) rather than by a token.
  TokenEvent finish_event(FinishReason reason, const std::string& error);
  // Tokens the sampler must not pick now: end-of-generation and stop ids before min_tokens.
  std::vector<int32_t> banned_tokens() const;
  Usage usage() const;
  uint64_t id() const { return static_cast<uint64_t>(seq.id); }

  const Tokenizer* tokenizer;
  int64_t context_length;
  Sequence seq;
  Sampler sampler;
  OutputText text;
  SamplingParams params;
  std::shared_ptr<RequestStream> stream;
  bool detokenize = true;
  bool admitted = false;
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;
  int64_t spec_num_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  uint64_t draft_seed = 0;
  std::vector<float> draft_probs;  // [draft x vocab] q rows of this step's drafts (empty: deterministic drafts)

 private:
  // Appends a sampled token to the request and to `e`; true when the request is finished (stop token, stop string,
  // max_tokens, context).
  bool push_token(SampleResult& r, TokenEvent& e);
};

// A step's token events. They are delivered after the step's bookkeeping and stats, so a consumer that sees a
// request finish also sees stats without it. All of them are queued before the first notification: a consumer of
// many streams (the in-process load generator) then takes the whole step in one wake-up instead of one per request.
class EventOutbox {
 public:
  void add(std::shared_ptr<RequestStream> stream, TokenEvent event) {
    events_.emplace_back(std::move(stream), std::move(event));
  }
  void deliver();

 private:
  std::vector<std::pair<std::shared_ptr<RequestStream>, TokenEvent>> events_;
};

}  // namespace servetune
