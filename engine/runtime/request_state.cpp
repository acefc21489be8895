// A request's token bookkeeping on the engine thread (see request_state.h).
#include "runtime/request_state.h"

#include <algorithm>

#include "runtime/speculator.h"
#include "tokenizer/tokenizer.h"

namespace servetune {

RequestState::RequestState(uint64_t id, const Tokenizer& tok, int64_t context_length, const SamplingParams& params,
                           uint64_t seed, std::vector<int32_t> prompt, std::shared_ptr<RequestStream> s)
    : tokenizer(&tok),
      context_length(context_length),
      sampler(params, seed, prompt),
      text(tok, params.stop),
      params(params),
      stream(std::move(s)) {
  seq.id = static_cast<int64_t>(id);
  seq.prompt_len = static_cast<int64_t>(prompt.size());
  seq.max_total_len = seq.prompt_len + params.max_tokens;
  seq.tokens = std::move(prompt);
  draft_seed = params.seed.value_or(seed);
}

RequestState::Emitted RequestState::emit(int64_t num_draft, int32_t device_token, int64_t vocab,
                                         const std::function<std::span<float>(size_t)>& logits, TokenEvent& e) {
  std::vector<int32_t> draft, parents;  // parents: a draft tree's (Sequence::draft_parents), empty for a chain
  if (num_draft > 0) {
    draft.assign(seq.tokens.end() - num_draft, seq.tokens.end());
    seq.tokens.resize(seq.tokens.size() - static_cast<size_t>(num_draft));
    parents = std::move(seq.draft_parents);
  }
  seq.draft_parents.clear();
  e.request_id = id();
  Emitted out;
  if (device_token >= 0) {
    SampleResult r;
    r.token = device_token;
    sampler.accept(r.token);
    out.finished = push_token(r, e);
  } else {
    // The draft distributions of the drafts (empty for deterministic drafts).
    std::span<const float> probs;
    if (!draft_probs.empty() && num_draft > 0) {
      probs = std::span<const float>(draft_probs).first(static_cast<size_t>(num_draft * vocab));
    }
    const auto push = [&](SampleResult& r) { return out.finished = push_token(r, e); };
    if (!parents.empty()) {
      out.path = verify_tree(sampler, draft, parents, logits, [&] { return banned_tokens(); }, push);
      out.accepted = static_cast<int64_t>(out.path.size());
    } else {
      out.accepted = verify_draft(sampler, draft, logits, [&] { return banned_tokens(); }, push, probs);
    }
  }
  if (num_draft > 0) {
    ++spec_num_drafts;
    spec_draft_tokens += num_draft;
    spec_accepted_tokens += out.accepted;
  }
  return out;
}

bool RequestState::push_token(SampleResult& r, TokenEvent& e) {
  seq.tokens.push_back(r.token);
  ++output_tokens;
  e.token_ids.push_back(r.token);
  if (output_tokens == 1) e.first_token = true;

  FinishReason reason = FinishReason::kNone;
  const bool eog = !params.ignore_eos && tokenizer->is_eog(r.token);
  const auto& stop_ids = params.stop_token_ids;
  const bool stop_id = std::find(stop_ids.begin(), stop_ids.end(), r.token) != stop_ids.end();
  if (eog || stop_id) {
    reason = FinishReason::kStop;
  } else if (detokenize) {
    e.text += text.push(r.token);
    if (text.stopped()) reason = FinishReason::kStop;
  }
  if (reason == FinishReason::kNone && (output_tokens >= params.max_tokens || seq.size() >= context_length)) {
    reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone && detokenize) e.text += text.finish();
  if (params.logprobs >= 0) e.logprobs.push_back(std::move(r));
  e.finish = reason;
  return reason != FinishReason::kNone;
}

TokenEvent RequestState::finish_event(FinishReason reason, const std::string& error) {
  TokenEvent e;
  e.request_id = id();
  e.time = EngineClock::now();
  e.finish = reason;
  e.error = error;
  if (detokenize && reason != FinishReason::kAbort && reason != FinishReason::kError) e.text = text.finish();
  e.usage = usage();
  return e;
}

std::vector<int32_t> RequestState::banned_tokens() const {
  std::vector<int32_t> banned;
  if (output_tokens < params.min_tokens) {
    if (!params.ignore_eos) banned = tokenizer->eog_ids();
    banned.insert(banned.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  }
  return banned;
}

Usage RequestState::usage() const {
  return Usage{seq.prompt_len, output_tokens, cached_tokens, spec_num_drafts, spec_draft_tokens, spec_accepted_tokens};
}

void EventOutbox::deliver() {
  for (auto& [stream, event] : events_) stream->push(std::move(event), false);
  const RequestStream* last = nullptr;
  for (auto& [stream, event] : events_) {
    if (stream.get() != last) stream->notify();  // once per run of a stream's events (one run in a step)
    last = stream.get();
  }
  events_.clear();
}

}  // namespace servetune
