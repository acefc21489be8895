// Draft-head speculation: MTP layers and EAGLE heads (see draft_head_speculator.h).
#include "runtime/draft_head_speculator.h"

#include <algorithm>

#include "core/error.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "runtime/draft_head_active.h"
#include "runtime/draft_speculator.h"
#include "runtime/model_runner.h"

namespace servetune {

DraftHeadSpeculator::DraftHeadSpeculator(std::shared_ptr<Model> head, const SpeculatorContext& context,
                                         const DraftTreeShape& shape, const char* name)
    : model_(std::move(head)), name_(name), num_steps_(std::max<int64_t>(1, shape.num_steps)),
      topk_(std::max<int64_t>(1, shape.topk)), num_nodes_(std::max<int64_t>(1, shape.num_nodes)),
      page_size_(context.page_size), max_batch_tokens_(std::max<int64_t>(1, context.max_batch_tokens)) {
  if (context.backend == nullptr || !model_) throw Error(ErrorKind::kInternal, "DraftHeadSpeculator needs a head and a backend");
  hidden_ = model_->config().hidden;
  context_length_ = model_->config().context_length;
  const int64_t num_blocks = std::max<int64_t>(1, (context.kv_tokens + page_size_ - 1) / page_size_);
  kv_ = std::make_unique<KvStorage>(*context.backend, model_->config(), model_->local_kv_heads(), num_blocks, page_size_,
                                    context.kv_dtype);
  blocks_ = std::make_unique<BlockManager>(num_blocks, page_size_, context.prefix_caching);
}

DraftHeadSpeculator::~DraftHeadSpeculator() = default;

int64_t DraftHeadSpeculator::hidden_rows(const State& st) const { return static_cast<int64_t>(st.hidden.size()) / hidden_; }

void DraftHeadSpeculator::target_hidden(int64_t seq_id, int64_t first_position, std::span<const float> rows) {
  if (rows.size() % static_cast<size_t>(hidden_) != 0) {
    throw Error(ErrorKind::kInternal, "target hidden rows are not whole rows of the model's hidden size");
  }
  State& st = states_[seq_id];
  const int64_t end = st.hidden_from + hidden_rows(st);
  if (st.hidden.empty() || first_position < st.hidden_from || first_position > end) {
    st.hidden.clear();  // a fresh start, or a gap (prefix-cache hit) the rows before cannot bridge
    st.hidden_from = first_position;
  } else {
    st.hidden.resize(static_cast<size_t>((first_position - st.hidden_from) * hidden_));  // a recomputed tail
  }
  st.hidden.insert(st.hidden.end(), rows.begin(), rows.end());
}

void DraftHeadSpeculator::append_input(State& st, int64_t p) {
  const int64_t row = p - st.hidden_from;
  if (row >= 0 && row < hidden_rows(st)) {
    const auto from = st.hidden.begin() + static_cast<long>(row * hidden_);
    batch_.input_hidden.insert(batch_.input_hidden.end(), from, from + static_cast<long>(hidden_));
    return;
  }
  ++missing_hidden_;
  if (st.first_without_hidden < 0) st.first_without_hidden = p;
  batch_.input_hidden.insert(batch_.input_hidden.end(), static_cast<size_t>(hidden_), 0.0f);
}

// Registers the sequence's full blocks for other requests, but none holding a row computed without the target's state.
void DraftHeadSpeculator::share_blocks(State& st) {
  Sequence& seq = st.seq;
  const int64_t computed = seq.num_computed;
  if (st.first_without_hidden >= 0) seq.num_computed = std::min(computed, st.first_without_hidden);
  blocks_->commit(seq);
  seq.num_computed = computed;
}

void DraftHeadSpeculator::forward(bool return_hidden) {
  batch_.return_hidden = return_hidden;
  model_->forward(batch_, *kv_, logits_);
}

void DraftHeadSpeculator::propose(std::span<const DraftSlot> slots) {
  std::vector<Active> active;
  active.reserve(slots.size());
  for (const DraftSlot& slot : slots) {
    slot.draft->clear();
    slot.draft_probs->clear();
    const auto n = static_cast<int64_t>(slot.tokens.size());
    // MTP positions n-2 .. n-3+want run; the head must hold them in its context. With want 0 (no drafts this step)
    // the cache still catches up, so the target's states do not pile up.
    if (n < 2) continue;
    const int64_t per_step = topk_ > 1 ? num_nodes_ : num_steps_;
    const int64_t want = std::max<int64_t>(0, std::min({slot.max_tokens, per_step, context_length_ - n + 2}));
    State& st = states_[slot.seq_id];
    if (!st.seeded) {
      st.seq.id = slot.seq_id;
      st.rng.seed(slot.seed ^ 0x3a7d3a7d3a7dull);
      st.seeded = true;
    }
    st.seq.tokens.assign(slot.tokens.begin() + 1, slot.tokens.end());
    if (st.seq.block_table.empty()) blocks_->begin(st.seq);  // a new request: full blocks another one computed
    if (st.seq.num_computed > n - 1) {  // cannot happen: the cache only holds emitted tokens' positions
      st.seq.num_computed = n - 1;
      blocks_->truncate(st.seq, n - 1);
    }
    if (slot.draft_parents != nullptr) slot.draft_parents->clear();
    Active a;
    a.slot = &slot;
    a.state = &st;
    a.want = want;
    // Nothing new since the last propose (the step before did not schedule the request): the head holds position
    // n - 2 already, and recomputing it could rewrite a shared block's row, so no drafts this time.
    if (st.seq.num_computed >= n - 1) {
      a.want = 0;
      a.caught_up = true;
    }
    a.real = n - 1;
    a.steps = std::max<int64_t>(1, std::min(num_steps_, context_length_ - n + 2));
    active.push_back(std::move(a));
  }
  catch_up(active);
  if (topk_ > 1) {
    tree_steps(active);
  } else {
    draft_steps(active);
  }
  for (Active& a : active) {  // drop the draft steps' positions; keep only what the target's states gave
    if (topk_ > 1 && !a.cands.empty()) tree_select(a);
    Sequence& seq = a.state->seq;
    seq.tokens.resize(static_cast<size_t>(a.real));
    seq.num_computed = std::min(seq.num_computed, a.real);
    blocks_->truncate(seq, a.real);
  }
}

// Feeds every position the MTP cache lacks; the forward that reaches a request's position n-2 yields its first draft.
// Requests share forwards of at most max_batch_tokens_ tokens.
void DraftHeadSpeculator::catch_up(std::vector<Active>& active) {
  for (;;) {
    SchedulerOutput step;
    std::vector<Active*> sampling;
    int64_t budget = max_batch_tokens_;
    for (Active& a : active) {
      if (a.stopped || a.caught_up || budget <= 0) continue;
      if (schedule_catch_up(a.state->seq, *blocks_, budget, step, a.stopped)) sampling.push_back(&a);
    }
    if (step.seqs.empty()) return;
    ModelRunner::build_batch(step, page_size_, batch_);
    batch_.input_hidden.clear();
    std::vector<int64_t> last_token;  // per scheduled sequence, its last token's row in the batch
    int64_t row = 0;
    for (const ScheduledSeq& s : step.seqs) {
      State& st = states_.at(s.seq->id);
      for (int64_t p = s.seq->num_computed; p < s.seq->num_computed + s.num_tokens; ++p) append_input(st, p);
      row += s.num_tokens;
      last_token.push_back(row - 1);
    }
    forward(num_steps_ > 1);  // a draft step's input: the head's state at the last position (chains and trees)
    const auto vocab = static_cast<size_t>(model_->config().vocab);
    size_t sample = 0;  // logits row of the next sampling sequence
    for (size_t i = 0; i < step.seqs.size(); ++i) {
      Sequence& seq = *step.seqs[i].seq;
      seq.num_computed += step.seqs[i].num_tokens;
      State& st = states_.at(seq.id);
      share_blocks(st);
      const int64_t consumed = std::clamp<int64_t>(seq.num_computed - st.hidden_from, 0, hidden_rows(st));
      st.hidden.erase(st.hidden.begin(), st.hidden.begin() + static_cast<long>(consumed * hidden_));
      st.hidden_from += consumed;
      if (!step.seqs[i].samples) continue;
      Active& a = *sampling[sample];
      const size_t logits_row = sample++;
      a.caught_up = true;
      if (a.want == 0) continue;
      const std::span<const float> logits(logits_.data() + logits_row * vocab, vocab);
      std::span<const float> h;
      if (num_steps_ > 1) h = model_->hidden_rows().subspan(static_cast<size_t>(last_token[i] * hidden_), static_cast<size_t>(hidden_));
      if (topk_ > 1) {
        tree_root(a, logits, h);
        continue;
      }
      a.slot->draft->push_back(draw_draft_token(logits, *a.slot->sampling, st.rng, q_, *a.slot->draft_probs));
      a.last.assign(h.begin(), h.end());
    }
  }
}

// Each step feeds the last draft of every request that wants more, with the head's own hidden state before it.
void DraftHeadSpeculator::draft_steps(std::vector<Active>& active) {
  for (;;) {
    SchedulerOutput step;
    std::vector<Active*> stepping;
    std::vector<float> inputs;  // the head's own states, one per stepping request
    for (Active& a : active) {
      Sequence& seq = a.state->seq;
      const auto drafted = static_cast<int64_t>(a.slot->draft->size());
      if (a.stopped || drafted == 0 || drafted >= a.want) continue;
      if (!blocks_->allocate(seq, seq.num_computed + 1)) {
        a.stopped = true;
        continue;
      }
      seq.tokens.push_back(a.slot->draft->back());
      step.seqs.push_back({&seq, 1, true, 0});
      stepping.push_back(&a);
      inputs.insert(inputs.end(), a.last.begin(), a.last.end());
    }
    if (step.seqs.empty()) return;
    ModelRunner::build_batch(step, page_size_, batch_);
    batch_.input_hidden = std::move(inputs);
    forward(true);
    const auto vocab = static_cast<size_t>(model_->config().vocab);
    for (size_t i = 0; i < stepping.size(); ++i) {
      Active& a = *stepping[i];
      a.state->seq.num_computed += 1;
      const std::span<const float> logits(logits_.data() + i * vocab, vocab);
      a.slot->draft->push_back(draw_draft_token(logits, *a.slot->sampling, a.state->rng, q_, *a.slot->draft_probs));
      const auto h = model_->hidden_rows().subspan(i * static_cast<size_t>(hidden_), static_cast<size_t>(hidden_));
      a.last.assign(h.begin(), h.end());
    }
  }
}

void DraftHeadSpeculator::rollback(int64_t seq_id, std::span<const int32_t> tokens) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  State& st = it->second;
  // The target's states are valid for positions 0 .. tokens - 2 (the verified drafts and the token before them).
  const int64_t keep = std::clamp<int64_t>(static_cast<int64_t>(tokens.size()) - 1 - st.hidden_from, 0, hidden_rows(st));
  st.hidden.resize(static_cast<size_t>(keep * hidden_));
}

void DraftHeadSpeculator::release(int64_t seq_id) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  blocks_->release(it->second.seq);
  states_.erase(it);
}

}  // namespace servetune
