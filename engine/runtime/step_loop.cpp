// One replica's engine thread (see step_loop.h): the wait for work, the step, and the stats it publishes.
#include "runtime/step_loop.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/block_manager.h"
#include "runtime/model_runner.h"
#include "runtime/scheduler.h"
#include "runtime/speculator.h"
#include "runtime/tensor_parallel_group.h"

namespace servetune {

StepLoop::StepLoop(const StepParts& parts) : parts_(parts) {
  // A draft head reading the target's hidden states needs the host forward that keeps them.
  device_sampling_ = parts_.ranks->device_sampling() && !(parts_.speculator && parts_.speculator->wants_hidden());
  keep_alive_ = parts_.ranks->keep_alive_interval();
  const int64_t page = parts_.blocks->page_size();
  kv_bytes_per_token_ = parts_.ranks->kv_block_bytes(page, parts_.ranks->kv_dtype()) / page;
  publish_stats(0, 0);  // capacity and free blocks are known before the first step
  thread_ = std::thread([this] { loop(); });
}

StepLoop::~StepLoop() { shutdown(); }

void StepLoop::enqueue(std::unique_ptr<RequestState> state) {
  std::lock_guard lock(mutex_);
  if (stopping_) throw_usage("the engine is shut down");
  live_ids_.insert(state->id());
  pending_.push_back(std::move(state));
  cv_.notify_one();
}

bool StepLoop::abort(uint64_t id) {
  std::lock_guard lock(mutex_);
  if (live_ids_.count(id) == 0) return false;
  aborts_.push_back(id);
  cv_.notify_one();
  return true;
}

int64_t StepLoop::flush_prefix_cache() {
  std::unique_lock lock(mutex_);
  if (stopping_) return 0;
  const uint64_t ticket = ++flushes_asked_;
  cv_.notify_one();
  flushed_cv_.wait(lock, [&] { return flushes_done_ >= ticket || stopping_; });
  return flushes_done_ >= ticket ? flushed_blocks_ : 0;
}

int64_t StepLoop::num_live() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(live_ids_.size());
}

EngineStats StepLoop::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void StepLoop::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    cv_.notify_one();
    flushed_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void StepLoop::loop() {
  const bool replicas = parts_.ranks->dp_attention();
  for (;;) {
    std::vector<std::unique_ptr<RequestState>> incoming;
    std::vector<uint64_t> aborts;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      const auto ready = [&] {
        return stopping_ || !pending_.empty() || !aborts_.empty() || flushes_asked_ > flushes_done_ ||
               parts_.scheduler->has_work();
      };
      if (replicas) {
        // Every replica joins every step; an idle one looks for work at this interval meanwhile.
        if (!replicas_busy_) cv_.wait_for(lock, kReplicaPollInterval, ready);
      } else if (keep_alive_.count() == 0) {
        cv_.wait(lock, ready);
      } else if (!cv_.wait_for(lock, keep_alive_, ready)) {
        lock.unlock();
        keep_alive();
        continue;
      }
      incoming.swap(pending_);
      aborts.swap(aborts_);
      stopping = stopping_;
      if (flushes_asked_ > flushes_done_) {  // between steps: no sequence is being scheduled
        flushed_blocks_ = parts_.blocks->flush_cached();
        if (parts_.speculator) parts_.speculator->flush_cache();
        flushes_done_ = flushes_asked_;
        flushed_cv_.notify_all();
      }
    }
    for (auto& st : incoming) {
      Sequence* seq = &st->seq;
      states_.emplace(st->id(), std::move(st));
      parts_.scheduler->add(seq);
    }
    for (uint64_t id : aborts) {
      auto it = states_.find(id);
      if (it == states_.end()) continue;
      finish(*it->second, FinishReason::kAbort);
      remove(id);
      ++counters_.requests_aborted;
    }
    if (replicas) {
      stopping = step_with_replicas(stopping);
    } else if (!stopping) {
      if (!aborts.empty()) publish_stats(0, 0);
      step();
    }
    if (stopping) {
      abort_all();
      outbox_.deliver();
      return;
    }
    outbox_.deliver();
  }
}

// Shutdown: no request is taken any more, and each one here ends with an abort.
void StepLoop::abort_all() {
  std::vector<std::unique_ptr<RequestState>> queued;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;  // a replica stopped by its peers refuses new requests as one stopped itself
    queued.swap(pending_);
  }
  for (auto& st : queued) {
    Sequence* seq = &st->seq;
    states_.emplace(st->id(), std::move(st));
    parts_.scheduler->add(seq);
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, st] : states_) ids.push_back(id);
  for (uint64_t id : ids) {
    finish(*states_[id], FinishReason::kAbort);
    remove(id);
    ++counters_.requests_aborted;
  }
  publish_stats(0, 0);
}

// Tells idle worker processes the engine is still there; a failure leaves the group broken, and the next step
// reports it to its requests.
void StepLoop::keep_alive() {
  try {
    parts_.ranks->keep_alive();
  } catch (const std::exception&) {
    keep_alive_ = std::chrono::milliseconds(0);
  }
}

void StepLoop::step() {
  SchedulerOutput out = plan();
  if (out.empty()) {
    nothing_scheduled();
    return;
  }
  execute(out);
}

// DP attention: every replica agrees on the step (run it, an empty one if nothing is scheduled here, or stop);
// returns whether the replicas stop.
bool StepLoop::step_with_replicas(bool stopping) {
  SchedulerOutput out;
  if (!stopping) out = plan();
  ReplicaSync sync;
  try {
    sync = parts_.ranks->sync_replicas(!out.empty(), stopping);
  } catch (const std::exception& ex) {
    // A replica failed or left: the group is broken, and what was scheduled here cannot run.
    fail_step(out, std::string("engine step failed: ") + ex.what());
    replicas_busy_ = false;
    return stopping;
  }
  replicas_busy_ = sync.any_batch && !sync.stopping;
  if (sync.stopping) return true;
  // A replica whose model is a worker process hears from it at every step; while all replicas idle, keep-alives.
  if (sync.any_batch) {
    last_contact_ = EngineClock::now();
  } else if (keep_alive_.count() > 0 && EngineClock::now() - last_contact_ >= keep_alive_) {
    keep_alive();
    last_contact_ = EngineClock::now();
  }
  if (!out.empty()) {
    execute(out);
    return false;
  }
  if (sync.any_batch) {
    ++counters_.idle_batches;
    try {
      parts_.ranks->forward_idle();
    } catch (const std::exception&) {
      // Nothing of this replica's ran; the replica whose step failed tells its requests.
    }
  }
  nothing_scheduled();
  return false;
}

// Drafts, then the scheduler's choice for this step (preempted sequences lose their drafts).
SchedulerOutput StepLoop::plan() {
  propose_drafts();
  SchedulerOutput out = parts_.scheduler->schedule();
  counters_.preemptions += static_cast<int64_t>(out.preempted.size());
  if (parts_.speculator) {
    for (const Sequence* seq : out.preempted) parts_.speculator->release(seq->id);
  }
  return out;
}

void StepLoop::nothing_scheduled() {
  publish_stats(0, 0);
  if (parts_.scheduler->num_running() == 0 && parts_.scheduler->num_waiting() > 0) {
    // Cannot happen with validated requests (each fits the cache alone); fail them rather than spin.
    std::vector<uint64_t> ids;
    for (const auto& [id, st] : states_) ids.push_back(id);
    for (uint64_t id : ids) {
      finish(*states_[id], FinishReason::kError, "the request cannot be scheduled with the current KV cache");
      remove(id);
    }
  }
}

void StepLoop::fail_step(const SchedulerOutput& out, const std::string& error) {
  for (const auto& s : out.seqs) {
    const auto id = static_cast<uint64_t>(s.seq->id);
    finish(*states_[id], FinishReason::kError, error);
    remove(id);
  }
}

void StepLoop::execute(const SchedulerOutput& out) {
  std::vector<SampleRow> rows;
  try {
    const auto start = EngineClock::now();
    rows = device_rows(out);
    if (rows.empty()) parts_.runner->run(out);
    else parts_.runner->run_sampled(out, rows);
    counters_.forward_seconds += std::chrono::duration<double>(EngineClock::now() - start).count();
  } catch (const std::exception& ex) {
    fail_step(out, std::string("engine step failed: ") + ex.what());
    return;
  }
  try {
    hand_hidden_states(out);
  } catch (const std::exception& ex) {
    fail_step(out, std::string("speculative draft head failed: ") + ex.what());
    return;
  }
  std::vector<int64_t> prompt_rows;  // counted before the step completes (they depend on num_computed)
  for (const auto& s : out.seqs) prompt_rows.push_back(ModelRunner::prompt_logit_rows(s));
  parts_.scheduler->complete(out);
  const auto now = EngineClock::now();
  size_t row = 0;
  size_t token_offset = 0;  // the sequence's first row in the batch
  std::vector<uint64_t> done;
  for (size_t i = 0; i < out.seqs.size(); ++i, token_offset += static_cast<size_t>(out.seqs[i - 1].num_tokens)) {
    const ScheduledSeq& s = out.seqs[i];
    RequestState& st = *states_[static_cast<uint64_t>(s.seq->id)];
    if (!st.admitted) {
      st.cached_tokens = s.seq->num_prefix_hit;
      st.admitted = true;
    }
    const int64_t first = s.seq->num_computed - (s.num_tokens - s.num_draft);
    counters_.prompt_tokens += std::clamp<int64_t>(s.seq->prompt_len - first, 0, s.num_tokens);
    std::vector<float> prompt_logits = take_prompt_logits(st, row, prompt_rows[i]);
    row += static_cast<size_t>(prompt_rows[i]);
    if (!s.samples) {
      if (!prompt_logits.empty()) {  // a prompt chunk's rows, ahead of any token
        TokenEvent e;
        e.request_id = st.id();
        e.prompt_logits = std::move(prompt_logits);
        e.time = now;
        e.usage = st.usage();
        outbox_.add(st.stream, std::move(e));
      }
      continue;
    }
    try {
      if (emit_tokens(st, s, row, token_offset, now, rows.empty() ? -1 : parts_.runner->token(row), std::move(prompt_logits))) {
        done.push_back(st.id());
      }
    } catch (const std::exception& ex) {
      finish(st, FinishReason::kError, std::string("sampling failed: ") + ex.what());
      done.push_back(st.id());
    }
    row += 1 + static_cast<size_t>(s.num_draft);
  }
  for (uint64_t id : done) {
    remove(id);
    ++counters_.requests_finished;
  }
  publish_stats(static_cast<int64_t>(out.seqs.size()), out.num_tokens);
}

// A sequence's teacher-forced prompt rows of this step (`count` rows from `row`), copied out for its event.
std::vector<float> StepLoop::take_prompt_logits(RequestState& st, size_t row, int64_t count) {
  std::vector<float> out;
  if (count == 0) return out;
  out.reserve(static_cast<size_t>(count * parts_.vocab));
  for (int64_t r = 0; r < count; ++r) {
    const std::span<float> l = parts_.runner->logits(row + static_cast<size_t>(r));
    out.insert(out.end(), l.begin(), l.end());
  }
  st.seq.prompt_logits_done = std::max(st.seq.prompt_logits_done, st.seq.num_computed);  // the step has completed
  return out;
}

// The step's device draws, when every sampling sequence can have one (no speculative draft, nothing
// Sampler::device_refusal names): one row per sampling sequence in step order, each drawing its uniform now.
// Empty: the step's logits come back and the host samples.
std::vector<SampleRow> StepLoop::device_rows(const SchedulerOutput& out) {
  std::vector<SampleRow> rows;
  if (!device_sampling_) return rows;
  for (const auto& s : out.seqs) {
    const RequestState& st = *states_.at(static_cast<uint64_t>(s.seq->id));
    if (s.seq->prompt_logits) return rows;  // its prompt rows come back to the host
    if (s.samples && (s.num_draft > 0 || st.sampler.device_refusal(st.banned_tokens()) != nullptr)) return rows;
  }
  for (const auto& s : out.seqs) {
    if (s.samples) rows.push_back(states_.at(static_cast<uint64_t>(s.seq->id))->sampler.device_row());
  }
  return rows;
}

// Takes one sampling sequence's tokens (from its logits rows starting at `row`, or `device_token` >= 0 drawn on the
// device), counts them, lets the scheduler and speculator drop rejected drafts, and queues the step's event for it;
// returns true when the request is finished.
bool StepLoop::emit_tokens(RequestState& st, const ScheduledSeq& s, size_t row, size_t token_offset,
                           EngineClock::time_point now, int32_t device_token, std::vector<float> prompt_logits) {
  TokenEvent e;
  e.prompt_logits = std::move(prompt_logits);
  const RequestState::Emitted r =
      st.emit(s.num_draft, device_token, parts_.vocab, [&](size_t j) { return parts_.runner->logits(row + j); }, e);
  counters_.generation_tokens += static_cast<int64_t>(e.token_ids.size());
  if (s.num_draft > 0) {
    ++counters_.spec_num_drafts;
    counters_.spec_draft_tokens += s.num_draft;
    counters_.spec_accepted_tokens += r.accepted;
    std::vector<int64_t>& per_position = counters_.spec_accepted_per_position;
    const auto num_draft = static_cast<size_t>(s.num_draft);
    if (per_position.size() < num_draft) per_position.resize(num_draft, 0);
    for (int64_t i = 0; i < r.accepted; ++i) ++per_position[static_cast<size_t>(i)];
    if (!r.finished) {
      if (!r.path.empty()) keep_tree_path(st.seq, token_offset, r.path);
      parts_.scheduler->accept_draft(&st.seq, r.accepted);
      parts_.speculator->rollback(st.seq.id, st.seq.tokens);
    }
  }
  e.time = now;
  e.usage = st.usage();
  outbox_.add(st.stream, std::move(e));
  return r.finished;
}

// A draft head that continues from the target's hidden states (MTP) gets each sequence's rows of the step, by
// position, before sampling (whose rollback drops the rejected drafts' rows).
void StepLoop::hand_hidden_states(const SchedulerOutput& out) {
  if (!parts_.speculator || !parts_.speculator->wants_hidden() || out.num_tokens == 0) return;
  const std::span<const float> rows = parts_.runner->hidden_rows();
  if (rows.empty() || rows.size() % static_cast<size_t>(out.num_tokens) != 0) {
    throw Error(ErrorKind::kInternal, "the model returned no hidden states for the draft head");
  }
  const size_t width = rows.size() / static_cast<size_t>(out.num_tokens);
  hidden_width_ = width;
  size_t offset = 0;
  for (const ScheduledSeq& s : out.seqs) {
    // A draft tree's nodes are not positions yet: its root's row now, the accepted path's after verification.
    const bool tree = s.num_draft > 0 && !s.seq->draft_parents.empty();
    const size_t count = static_cast<size_t>(tree ? s.num_tokens - s.num_draft : s.num_tokens) * width;
    parts_.speculator->target_hidden(s.seq->id, s.seq->num_computed, rows.subspan(offset, count));
    offset += static_cast<size_t>(s.num_tokens) * width;
  }
}

// An accepted draft-tree path (node indices, root to leaf): its K/V moves to the consecutive cache indices after the
// root (complete() left num_computed just past the root; node j sits at num_computed + j), where accept_draft()
// keeps it, and a draft head gets its hidden rows for those positions.
void StepLoop::keep_tree_path(const Sequence& seq, size_t token_offset, std::span<const int32_t> path) {
  std::vector<int64_t> src, dst;
  for (size_t k = 0; k < path.size(); ++k) {
    src.push_back(seq.num_computed + path[k]);
    dst.push_back(seq.num_computed + static_cast<int64_t>(k));
  }
  parts_.runner->move_kv(seq.block_table, src, dst);
  if (!parts_.speculator->wants_hidden()) return;
  const std::span<const float> rows = parts_.runner->hidden_rows();
  std::vector<float> kept;
  for (const int32_t node : path) {
    const auto from = rows.begin() + static_cast<long>((token_offset + 1 + static_cast<size_t>(node)) * hidden_width_);
    kept.insert(kept.end(), from, from + static_cast<long>(hidden_width_));
  }
  parts_.speculator->target_hidden(seq.id, seq.num_computed, kept);
}

// Proposes speculative drafts for every decoding sequence in one batched call (the scheduler takes what fits
// this step). A failing draft model fails the requests it was drafting for.
void StepLoop::propose_drafts() {
  if (!parts_.speculator) return;
  std::vector<DraftSlot> slots;
  for (auto& [id, st] : states_) {
    Sequence& seq = st->seq;
    st->draft_probs.clear();
    seq.draft_parents.clear();
    if (seq.status != SeqStatus::kRunning || seq.num_uncomputed() != 1) continue;
    const int64_t room = std::min(parts_.num_draft_tokens, seq.max_total_len - seq.size() - 1);
    if (room <= 0 && !parts_.speculator->wants_hidden()) continue;
    slots.push_back({seq.id, seq.tokens, std::max<int64_t>(room, 0), &st->params, st->draft_seed, &seq.draft,
                     &st->draft_probs, &seq.draft_parents});
  }
  if (slots.empty()) return;
  // Too many decoding requests for speculation to pay: no drafts this step (a draft head still catches up on the
  // target's states, with max_tokens 0).
  const int64_t limit = parts_.disable_by_batch_size;
  if (limit > 0 && static_cast<int64_t>(slots.size()) >= limit) {
    ++counters_.spec_disabled_steps;
    for (DraftSlot& slot : slots) slot.max_tokens = 0;
  }
  try {
    const auto start = EngineClock::now();
    parts_.speculator->propose(slots);
    counters_.spec_draft_seconds += std::chrono::duration<double>(EngineClock::now() - start).count();
  } catch (const std::exception& ex) {
    for (const DraftSlot& slot : slots) {
      const auto id = static_cast<uint64_t>(slot.seq_id);
      finish(*states_[id], FinishReason::kError, std::string("speculative draft failed: ") + ex.what());
      remove(id);
    }
  }
}

void StepLoop::finish(RequestState& st, FinishReason reason, const std::string& error) {
  outbox_.add(st.stream, st.finish_event(reason, error));
}

void StepLoop::remove(uint64_t id) {
  auto it = states_.find(id);
  parts_.scheduler->remove(&it->second->seq);
  if (parts_.speculator) parts_.speculator->release(static_cast<int64_t>(id));
  states_.erase(it);
  std::lock_guard lock(mutex_);
  live_ids_.erase(id);
}

void StepLoop::publish_stats(int64_t seqs, int64_t tokens) {
  if (tokens > 0) {
    ++counters_.steps;
    counters_.batched_tokens += tokens;
    counters_.batched_seqs += seqs;
    counters_.max_batch_tokens = std::max(counters_.max_batch_tokens, tokens);
  }
  EngineStats s = counters_;
  s.running = parts_.scheduler->num_running();
  s.waiting = parts_.scheduler->num_waiting();
  s.kv_blocks_total = parts_.blocks->num_blocks();
  s.kv_blocks_free = parts_.blocks->num_free_blocks();
  s.kv_blocks_used = parts_.blocks->num_used_blocks();
  s.page_size = parts_.blocks->page_size();
  s.prefix_query_tokens = parts_.blocks->prefix_query_tokens();
  s.prefix_hit_tokens = parts_.blocks->prefix_hit_tokens();
  s.comm_seconds = parts_.ranks->comm_seconds();
  s.comm_wait_seconds = parts_.ranks->comm_wait_seconds();
  s.collectives = parts_.ranks->collective_stats();
  s.spec_draft_kv_blocks_used = parts_.speculator ? parts_.speculator->kv_blocks_used() : 0;
  s.kv_bytes_per_token = kv_bytes_per_token_;
  const ExpertLoad load = parts_.ranks->expert_load();
  s.moe_experts = load.experts;
  s.moe_routed_tokens = load.routed;
  s.moe_busiest_expert_tokens = load.busiest;
  s.moe_ep_groups = load.experts > 0 ? load.ep_groups : 0;
  s.moe_busiest_ep_group_tokens = load.busiest_group;
  std::lock_guard lock(stats_mutex_);
  stats_ = s;
}

}  // namespace servetune
