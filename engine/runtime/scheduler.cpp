// Continuous-batching scheduler (see scheduler.h).
#include "runtime/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace servetune {
namespace {

// SGLang's rule: with a long queue, matching every waiting prompt against the cache costs more than it saves.
constexpr size_t kLpmMaxQueue = 128;

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks) : config_(config), blocks_(blocks) {
  if (config.max_running_requests <= 0) throw_usage("max_running_requests must be positive");
  if (config.max_batched_tokens <= 0) throw_usage("the per-step token budget must be positive");
}

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
  std::erase(running_, seq);
  std::erase(waiting_, seq);
  blocks_.release(*seq);
  seq->status = SeqStatus::kFinished;
}

int64_t Scheduler::prefill_limit(int64_t remaining, int64_t budget) const {
  int64_t n = std::min(remaining, budget);
  if (config_.chunked_prefill_size > 0) n = std::min(n, config_.chunked_prefill_size);
  return n;
}

void Scheduler::preempt(Sequence* seq, SchedulerOutput& out) {
  blocks_.release(*seq);
  seq->draft.clear();
  seq->draft_parents.clear();
  seq->status = SeqStatus::kWaiting;
  ++seq->num_preemptions;
  waiting_.push_front(seq);
  out.preempted.push_back(seq);
}

void Scheduler::order_waiting() {
  if (config_.policy != SchedulePolicy::kLpm || waiting_.size() > kLpmMaxQueue || waiting_.size() < 2) return;
  std::vector<std::pair<int64_t, Sequence*>> keyed;
  for (Sequence* s : waiting_) keyed.emplace_back(blocks_.cached_prefix_tokens(*s), s);
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < keyed.size(); ++i) waiting_[i] = keyed[i].second;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_batched_tokens;

  // Running sequences first: one decode token each, or the next chunk of an unfinished (re)prefill.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    const int64_t remaining = seq->num_uncomputed();
    int64_t n = remaining <= 1 ? remaining : prefill_limit(remaining, budget);
    if (config_.chunked_prefill_size <= 0 && n < remaining) {
      if (!out.seqs.empty()) continue;  // an unchunkable prefill waits for a step of its own
      n = remaining;
    }
    if (n <= 0) continue;
    // Speculative drafts of a decoding sequence: as many as the budget, its length limit and free blocks allow.
    int64_t k = 0;
    if (remaining == 1 && !seq->draft.empty()) {
      k = std::min({static_cast<int64_t>(seq->draft.size()), budget - 1, seq->max_total_len - seq->size() - 1});
      if (k > 0 && !blocks_.allocate(*seq, seq->num_computed + 1 + k)) k = 0;
    }
    if (k > 0) {
      seq->tokens.insert(seq->tokens.end(), seq->draft.begin(), seq->draft.begin() + k);
      seq->draft.clear();
      // A tree's first k nodes are a tree too (parents come first); verification reads their parents.
      if (!seq->draft_parents.empty()) seq->draft_parents.resize(static_cast<size_t>(k));
      out.seqs.push_back({seq, 1 + k, true, k});
      budget -= 1 + k;
      continue;
    }
    seq->draft.clear();
    seq->draft_parents.clear();
    bool preempted_self = false;
    while (!blocks_.allocate(*seq, seq->num_computed + n)) {
      Sequence* victim = running_.back();
      running_.pop_back();
      preempt(victim, out);
      if (victim == seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    out.seqs.push_back({seq, n, seq->num_computed + n == seq->size()});
    budget -= n;
  }

  // Then admit waiting sequences, unless this step had to preempt (the cache is full).
  if (out.preempted.empty()) {
    order_waiting();
    while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_running_requests) {
      Sequence* seq = waiting_.front();
      const int64_t cached = blocks_.cached_prefix_tokens(*seq);
      const int64_t remaining = seq->size() - cached;
      int64_t n = prefill_limit(remaining, budget);
      if (config_.chunked_prefill_size <= 0 && n < remaining) {
        if (!out.seqs.empty()) break;
        n = remaining;  // too long for any budget: runs alone in an oversized step rather than never
      }
      if (!blocks_.can_admit(*seq, cached + n)) break;
      waiting_.pop_front();
      blocks_.begin(*seq);
      if (!blocks_.allocate(*seq, seq->num_computed + n)) throw Error(ErrorKind::kInternal, "admission allocation failed");
      seq->status = SeqStatus::kRunning;
      running_.push_back(seq);
      out.seqs.push_back({seq, n, seq->num_computed + n == seq->size()});
      budget -= n;
    }
  }
  for (const auto& s : out.seqs) out.num_tokens += s.num_tokens;
  return out;
}

void Scheduler::complete(const SchedulerOutput& out) {
  for (const auto& s : out.seqs) {
    s.seq->num_computed += s.num_tokens - s.num_draft;
    blocks_.commit(*s.seq);
  }
}

void Scheduler::accept_draft(Sequence* seq, int64_t accepted) {
  if (accepted < 0 || seq->num_computed + accepted > seq->size()) {
    throw Error(ErrorKind::kInternal, "accept_draft: more accepted drafts than tokens");
  }
  seq->num_computed += accepted;
  blocks_.truncate(*seq, seq->size());
  blocks_.commit(*seq);
}

}  // namespace servetune
