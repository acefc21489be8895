// Draft-model speculation (see draft_speculator.h).
#include "runtime/draft_speculator.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace servetune {

struct DraftModelSpeculator::Active {
  const DraftSlot* slot = nullptr;
  State* state = nullptr;
  int64_t want = 0;      // draft tokens to propose
  bool stopped = false;  // the draft cache ran out of blocks: keep what was proposed
};

namespace {

void check_same_vocabulary(const std::string& draft_path, const std::string& target_path, int64_t draft_vocab,
                           int64_t target_vocab, const Tokenizer& draft_tok, const Tokenizer& target_tok) {
  const std::string files = "draft model " + draft_path + " and target model " + target_path;
  if (draft_vocab != target_vocab || draft_tok.vocab_size() != target_tok.vocab_size()) {
    throw_usage("speculative draft model: " + files + " have different vocabularies (" + std::to_string(draft_vocab) +
                " vs " + std::to_string(target_vocab) + " logits, " + std::to_string(draft_tok.vocab_size()) + " vs " +
                std::to_string(target_tok.vocab_size()) + " tokens); the draft must share the target's tokenizer");
  }
  for (int32_t id = 0; id < target_tok.vocab_size(); ++id) {
    if (draft_tok.token_text(id) != target_tok.token_text(id)) {
      throw_usage("speculative draft model: " + files + " have different vocabularies (token " + std::to_string(id) +
                  " is '" + draft_tok.token_text(id) + "' vs '" + target_tok.token_text(id) +
                  "'); the draft must share the target's tokenizer");
    }
  }
}

}  // namespace

void draft_distribution(std::span<const float> logits, const SamplingParams& params, std::vector<float>& q) {
  const size_t vocab = logits.size();
  q.assign(vocab, 0.0f);
  const float best = *std::max_element(logits.begin(), logits.end());
  const float inv_t = 1.0f / params.temperature;
  const bool filtered = params.top_k > 0 || params.top_p < 1.0f || params.min_p > 0.0f;
  if (!filtered) {
    double total = 0.0;
    for (size_t i = 0; i < vocab; ++i) total += q[i] = std::exp((logits[i] - best) * inv_t);
    for (float& v : q) v = static_cast<float>(v / total);
    return;
  }
  std::vector<int32_t> order;
  std::vector<double> p;
  const size_t cut = filtered_candidates(logits, params, order, p);
  const double kept = std::accumulate(p.begin(), p.begin() + static_cast<long>(cut), 0.0);
  for (size_t i = 0; i < cut; ++i) q[static_cast<size_t>(order[i])] = static_cast<float>(p[i] / kept);
}

DraftModelSpeculator::DraftModelSpeculator(const std::string& draft_path, const std::string& target_path,
                                           const SpeculatorContext& context)
    : max_batch_tokens_(std::max<int64_t>(1, context.max_batch_tokens)) {
  if (context.backend == nullptr || context.target_tokenizer == nullptr) {
    throw Error(ErrorKind::kInternal, "DraftModelSpeculator needs the target's backend and tokenizer");
  }
  if (!std::filesystem::exists(draft_path)) {
    throw_usage("speculative_draft_model '" + draft_path + "' does not exist (--speculative-draft-model PATH)");
  }
  checkpoint_ = std::make_unique<Checkpoint>(draft_path, LoadFormat::kAuto);
  const auto tokenizer = checkpoint_->load_tokenizer();
  check_same_vocabulary(draft_path, target_path, checkpoint_->config().vocab, context.target_vocab, *tokenizer,
                        *context.target_tokenizer);
  model_ = checkpoint_->load(*context.backend, ParallelContext{});
  vocab_ = model_->config().vocab;
  context_length_ = model_->config().context_length;
  const int64_t page = context.page_size;
  const int64_t num_blocks = std::max<int64_t>(1, (context.kv_tokens + page - 1) / page);
  kv_ = std::make_unique<KvStorage>(*context.backend, model_->config(), model_->local_kv_heads(), num_blocks, page,
                                    context.kv_dtype);
  blocks_ = std::make_unique<BlockManager>(num_blocks, page, /*enable_prefix_caching=*/false);
  runner_ = std::make_unique<ModelRunner>(*model_, *kv_);
}

DraftModelSpeculator::~DraftModelSpeculator() = default;

void DraftModelSpeculator::sync(State& st, std::span<const int32_t> tokens) {
  Sequence& seq = st.seq;
  const auto computed = static_cast<size_t>(seq.num_computed);
  const auto limit = std::min(computed, tokens.size());
  const auto common = static_cast<int64_t>(std::mismatch(seq.tokens.begin(), seq.tokens.begin() + static_cast<long>(limit),
                                                         tokens.begin()).first - seq.tokens.begin());
  seq.num_computed = std::min(common, static_cast<int64_t>(tokens.size()) - 1);
  seq.num_computed = std::max<int64_t>(seq.num_computed, 0);
  seq.tokens.assign(tokens.begin(), tokens.end());
  blocks_->truncate(seq, seq.num_computed);
}

bool schedule_catch_up(Sequence& seq, BlockManager& blocks, int64_t& budget, SchedulerOutput& step, bool& stopped) {
  const int64_t take = std::min(seq.num_uncomputed(), budget);
  if (!blocks.allocate(seq, seq.num_computed + take)) {
    stopped = true;
    return false;
  }
  const bool samples = take == seq.num_uncomputed();
  step.seqs.push_back({&seq, take, samples, 0});
  budget -= take;
  return samples;
}

int32_t draw_draft_token(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng,
                         std::vector<float>& q, std::vector<float>& draft_probs) {
  if (params.greedy()) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  draft_distribution(logits, params, q);
  std::discrete_distribution<int32_t> pick(q.begin(), q.end());
  const int32_t token = pick(rng);
  draft_probs.insert(draft_probs.end(), q.begin(), q.end());
  return token;
}

void DraftModelSpeculator::append_draft(Active& a, std::span<const float> logits) {
  const int32_t token = draw_draft_token(logits, *a.slot->sampling, a.state->rng, q_, *a.slot->draft_probs);
  a.slot->draft->push_back(token);
  a.state->seq.tokens.push_back(token);
}

void DraftModelSpeculator::propose(std::span<const DraftSlot> slots) {
  std::vector<Active> active;
  active.reserve(slots.size());
  for (const DraftSlot& slot : slots) {
    slot.draft->clear();
    slot.draft_probs->clear();
    const auto n = static_cast<int64_t>(slot.tokens.size());
    // Draft positions n-1 .. n+want-2 are fed to the draft model, which must hold them in its context.
    const int64_t want = std::min(slot.max_tokens, context_length_ - n + 1);
    if (want <= 0 || n == 0) continue;
    auto [it, fresh] = states_.try_emplace(slot.seq_id);
    if (fresh) {
      it->second.seq.id = slot.seq_id;
      it->second.rng.seed(slot.seed ^ 0x5eed5eed5eedull);
    }
    sync(it->second, slot.tokens);
    active.push_back({&slot, &it->second, want, false});
  }

  // Catch-up: feed every token the draft KV lacks; the forward that reaches a request's last token yields its first
  // draft. Requests share forwards of at most max_batch_tokens_ tokens.
  for (;;) {
    SchedulerOutput step;
    std::vector<Active*> sampling;
    int64_t budget = max_batch_tokens_;
    for (Active& a : active) {
      if (a.stopped || !a.slot->draft->empty() || budget <= 0) continue;
      if (schedule_catch_up(a.state->seq, *blocks_, budget, step, a.stopped)) sampling.push_back(&a);
    }
    if (step.seqs.empty()) break;
    runner_->run(step);
    for (const auto& s : step.seqs) s.seq->num_computed += s.num_tokens;
    for (size_t i = 0; i < sampling.size(); ++i) append_draft(*sampling[i], runner_->logits(i));
  }

  // Decode steps: each feeds the last draft of every request that wants more and proposes the next.
  for (;;) {
    SchedulerOutput step;
    std::vector<Active*> sampling;
    for (Active& a : active) {
      Sequence& seq = a.state->seq;
      const auto drafted = static_cast<int64_t>(a.slot->draft->size());
      if (a.stopped || drafted == 0 || drafted >= a.want) continue;
      if (!blocks_->allocate(seq, seq.num_computed + 1)) {
        a.stopped = true;
        continue;
      }
      step.seqs.push_back({&seq, 1, true, 0});
      sampling.push_back(&a);
    }
    if (step.seqs.empty()) break;
    runner_->run(step);
    for (const auto& s : step.seqs) s.seq->num_computed += 1;
    for (size_t i = 0; i < sampling.size(); ++i) append_draft(*sampling[i], runner_->logits(i));
  }
}

void DraftModelSpeculator::rollback(int64_t seq_id, std::span<const int32_t> tokens) {
  auto it = states_.find(seq_id);
  if (it != states_.end() && !tokens.empty()) sync(it->second, tokens);
}

void DraftModelSpeculator::release(int64_t seq_id) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  blocks_->release(it->second.seq);
  states_.erase(it);
}

}  // namespace servetune
