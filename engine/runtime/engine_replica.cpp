// One engine replica: owns model, KV cache, scheduler and per-request state; one thread runs schedule -> forward
// -> sample -> stream events. The Engine front (engine.cpp) routes requests to one or more of them.
#include "runtime/engine_replica.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "model/checkpoint.h"
#include "runtime/block_manager.h"
#include "runtime/model_runner.h"
#include "runtime/output_text.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/speculator.h"
#include "runtime/tensor_parallel_group.h"
#include "runtime/worker_launcher.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{8} << 30;
}

// "auto" is f32 on the CPU (exact against the reference) and f16 on GPUs (half the memory and bandwidth).
DType kv_dtype_for(KvCacheDtype setting, const Backend& backend) {
  if (setting == KvCacheDtype::kFp8E4m3) return DType::kFP8_E4M3;
  if (setting == KvCacheDtype::kF16 || (setting == KvCacheDtype::kAuto && !backend.host_memory())) return DType::kF16;
  return DType::kF32;
}

// KV bytes available under mem_fraction_static: of physical RAM on the CPU; on a GPU, SGLang's meaning: the fraction
// of device memory for weights and KV together, less what is in use now (the weights are loaded already).
int64_t kv_budget_bytes(double mem_fraction_static, const Backend& backend) {
  if (const auto mem = backend.device_memory()) {
    const double fraction = mem_fraction_static > 0 ? mem_fraction_static : kGpuDefaultMemFraction;
    return static_cast<int64_t>(fraction * static_cast<double>(mem->total)) - (mem->total - mem->free);
  }
  const double fraction = mem_fraction_static > 0 ? mem_fraction_static : kCpuDefaultMemFraction;
  return static_cast<int64_t>(fraction * static_cast<double>(physical_memory_bytes()));
}

struct RequestState {
  RequestState(uint64_t id, const Tokenizer& tok, const SamplingParams& params, uint64_t seed, std::vector<int32_t> prompt,
               std::shared_ptr<RequestStream> s)
      : sampler(params, seed, prompt), text(tok, params.stop), params(params), stream(std::move(s)) {
    seq.id = static_cast<int64_t>(id);
    seq.prompt_len = static_cast<int64_t>(prompt.size());
    seq.max_total_len = seq.prompt_len + params.max_tokens;
    seq.tokens = std::move(prompt);
    draft_seed = params.seed.value_or(seed);
  }
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
};

}  // namespace

class EngineReplica::Impl {
 public:
  explicit Impl(const EngineConfig& config) : config_(config) {
    checkpoint_ = std::make_unique<Checkpoint>(config_.model, config_.load_format, config_.seed);
    tokenizer_ = checkpoint_->load_tokenizer();
    // The replica's threads split evenly over its tensor-parallel ranks in this process (validate() ensures one each
    // at least): all of them with the local communicator, rank 0 alone with gloo (the others are worker processes).
    const int threads = config_.threads > 0 ? config_.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const std::chrono::milliseconds timeout = std::chrono::seconds(config_.dist_timeout);
    if (config_.comm_backend == CommBackend::kGloo) {
      local_workers_ = start_local_workers(config_);  // this node's other ranks, when it hosts several
      CommSpec spec = node_rank_spec(config_.tp_size, config_.nnodes, 0, 0, config_.dist_init_addr);
      spec.timeout = timeout;
      ranks_ = std::make_unique<TensorParallelGroup>(*checkpoint_, to_string(config_.device),
                                                     std::max(1, threads / ranks_per_node(config_)),
                                                     make_communicator("gloo", spec), timeout, compile_options(config_));
    } else {
      ranks_ = std::make_unique<TensorParallelGroup>(*checkpoint_, to_string(config_.device), config_.tp_size,
                                                     std::max(1, threads / config_.tp_size), compile_options(config_),
                                                     timeout);
    }
    model_config_ = ranks_->model(0).config();
    context_length_ = model_config_.context_length;
    if (config_.context_length) {
      if (*config_.context_length > context_length_) {
        throw_usage("context_length " + std::to_string(*config_.context_length) + " exceeds the model's " +
                    std::to_string(context_length_));
      }
      context_length_ = *config_.context_length;
    }

    const DType kv_dtype = kv_dtype_for(config_.kv_cache_dtype, ranks_->backend(0));
    const int64_t page = config_.page_size;
    const int64_t block_bytes = ranks_->kv_block_bytes(page, kv_dtype);
    int64_t num_blocks = 0;
    if (config_.max_total_tokens) {
      num_blocks = (*config_.max_total_tokens + page - 1) / page;
    } else {
      const int64_t budget = kv_budget_bytes(config_.mem_fraction_static, ranks_->backend(0));
      // No point in more KV than every running request at full context.
      const int64_t useful = (static_cast<int64_t>(config_.max_running_requests) * context_length_ + page - 1) / page;
      num_blocks = std::min(budget / block_bytes, useful);
      if (num_blocks <= 0) throw_usage("mem_fraction_static leaves no memory for the KV cache");
    }
    ranks_->create_kv(num_blocks, page, kv_dtype);
    blocks_ = std::make_unique<BlockManager>(num_blocks, page, !config_.disable_radix_cache);
    SchedulerConfig sc;
    sc.max_running_requests = config_.max_running_requests;
    sc.max_batched_tokens = config_.max_prefill_tokens;
    sc.chunked_prefill_size = config_.chunked_prefill_size;
    sc.policy = config_.schedule_policy;
    scheduler_ = std::make_unique<Scheduler>(sc, *blocks_);
    runner_ = std::make_unique<ModelRunner>(*ranks_);
    device_sampling_ = ranks_->device_sampling();
    SpeculatorContext spec_context;
    spec_context.backend = &ranks_->backend(0);
    spec_context.target_tokenizer = tokenizer_.get();
    spec_context.target_vocab = model_config_.vocab;
    spec_context.kv_tokens = num_blocks * page;  // the draft cache holds as many tokens as the target's
    spec_context.page_size = page;
    spec_context.kv_dtype = kv_dtype;
    spec_context.max_batch_tokens = config_.max_prefill_tokens;
    speculator_ = make_speculator(config_, spec_context);
    num_draft_tokens_ = speculative_draft_tokens(config_);
    keep_alive_ = ranks_->keep_alive_interval();
    publish_stats(0, 0);  // capacity and free blocks are known before the first step
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() { shutdown(); }

  PreparedRequest prepare(Request request) const {
    validate_sampling_params(request.sampling);
    std::vector<int32_t> ids;
    if (!request.prompt_ids.empty()) {
      if (!request.prompt.empty()) throw Error(ErrorKind::kInvalidRequest, "give either a text prompt or prompt token ids, not both");
      ids = std::move(request.prompt_ids);
      for (int32_t id : ids) {
        if (id < 0 || id >= model_config_.vocab) {
          throw Error(ErrorKind::kInvalidRequest, "prompt token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                                      std::to_string(model_config_.vocab - 1) + ")");
        }
      }
    } else {
      ids = tokenizer_->encode(request.prompt, request.add_special_tokens, request.parse_special);
    }
    if (ids.empty()) throw Error(ErrorKind::kInvalidRequest, "the prompt is empty");
    const auto total = static_cast<int64_t>(ids.size()) + request.sampling.max_tokens;
    if (total > context_length_) {
      throw Error(ErrorKind::kInvalidRequest, "prompt (" + std::to_string(ids.size()) + " tokens) + max_tokens (" +
                                                  std::to_string(request.sampling.max_tokens) + ") exceeds the context length " +
                                                  std::to_string(context_length_));
    }
    if (total > kv_capacity_tokens()) {
      throw Error(ErrorKind::kInvalidRequest, "prompt + max_tokens (" + std::to_string(total) + " tokens) exceeds the KV cache capacity (" +
                                                  std::to_string(kv_capacity_tokens()) + " tokens); raise max_total_tokens");
    }
    return PreparedRequest{std::move(ids), std::move(request.sampling), request.detokenize};
  }

  std::shared_ptr<RequestStream> enqueue(uint64_t id, PreparedRequest request, std::function<void()> notify) {
    std::lock_guard lock(mutex_);
    if (stopping_) throw_usage("the engine is shut down");
    auto stream = std::make_shared<RequestStream>(id);
    if (notify) stream->set_notifier(std::move(notify));
    const uint64_t seed = config_.seed * 0x9e3779b97f4a7c15ull + id;
    auto state = std::make_unique<RequestState>(id, *tokenizer_, request.sampling, seed, std::move(request.prompt_ids), stream);
    state->detokenize = request.detokenize;
    pending_.push_back(std::move(state));
    live_ids_.insert(id);
    cv_.notify_one();
    return stream;
  }

  bool abort(uint64_t id) {
    std::lock_guard lock(mutex_);
    if (live_ids_.count(id) == 0) return false;
    aborts_.push_back(id);
    cv_.notify_one();
    return true;
  }

  EngineStats stats() const {
    std::lock_guard lock(stats_mutex_);
    return stats_;
  }

  void shutdown() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

  int64_t kv_capacity_tokens() const { return blocks_->num_blocks() * blocks_->page_size(); }

  int64_t num_live() const {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(live_ids_.size());
  }

  EngineConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<WorkerProcess>> local_workers_;  // outlive ranks_, whose end stops them
  std::unique_ptr<TensorParallelGroup> ranks_;  // every rank's backend, weight shard and KV cache shard
  ModelConfig model_config_;
  int64_t context_length_ = 0;

 private:
  void finish(RequestState& st, FinishReason reason, const std::string& error = {}) {
    TokenEvent e;
    e.request_id = static_cast<uint64_t>(st.seq.id);
    e.time = EngineClock::now();
    e.finish = reason;
    e.error = error;
    if (st.detokenize && reason != FinishReason::kAbort && reason != FinishReason::kError) e.text = st.text.finish();
    e.usage = usage_of(st);
    outbox_.emplace_back(st.stream, std::move(e));
  }

  // Events are delivered after the step's bookkeeping and stats, so a consumer that sees a request finish
  // also sees stats without it. All of them are queued before the first notification: a consumer of many streams
  // (the in-process load generator) then takes the whole step in one wake-up instead of one per request.
  void deliver() {
    for (auto& [stream, event] : outbox_) stream->push(std::move(event), false);
    const RequestStream* last = nullptr;
    for (auto& [stream, event] : outbox_) {
      if (stream.get() != last) stream->notify();  // once per run of a stream's events (one run in a step)
      last = stream.get();
    }
    outbox_.clear();
  }

  Usage usage_of(const RequestState& st) const {
    return Usage{st.seq.prompt_len, st.output_tokens, st.cached_tokens, st.spec_num_drafts, st.spec_draft_tokens,
                 st.spec_accepted_tokens};
  }

  // Tokens the sampler must not pick now: end-of-generation and stop ids before min_tokens.
  std::vector<int32_t> banned_tokens(const RequestState& st) const {
    std::vector<int32_t> banned;
    if (st.output_tokens < st.params.min_tokens) {
      if (!st.params.ignore_eos) banned = tokenizer_->eog_ids();
      banned.insert(banned.end(), st.params.stop_token_ids.begin(), st.params.stop_token_ids.end());
    }
    return banned;
  }

  // Appends a sampled token to the request and to this step's event for it (several tokens when speculation
  // accepts a burst); true when the request is finished (stop token, stop string, max_tokens, context).
  bool push_token(RequestState& st, SampleResult& r, TokenEvent& e) {
    st.seq.tokens.push_back(r.token);
    ++st.output_tokens;
    e.token_ids.push_back(r.token);
    if (st.output_tokens == 1) e.first_token = true;

    FinishReason reason = FinishReason::kNone;
    const bool eog = !st.params.ignore_eos && tokenizer_->is_eog(r.token);
    const bool stop_id = std::find(st.params.stop_token_ids.begin(), st.params.stop_token_ids.end(), r.token) !=
                         st.params.stop_token_ids.end();
    if (eog || stop_id) {
      reason = FinishReason::kStop;
    } else if (st.detokenize) {
      e.text += st.text.push(r.token);
      if (st.text.stopped()) reason = FinishReason::kStop;
    }
    if (reason == FinishReason::kNone && (st.output_tokens >= st.params.max_tokens || st.seq.size() >= context_length_)) {
      reason = FinishReason::kLength;
    }
    if (reason != FinishReason::kNone && st.detokenize) e.text += st.text.finish();
    if (st.params.logprobs >= 0) e.logprobs.push_back(std::move(r));
    e.finish = reason;
    return reason != FinishReason::kNone;
  }

  // The step's device draws, when every sampling sequence can have one (no speculative draft, nothing
  // Sampler::device_refusal names): one row per sampling sequence in step order, each drawing its uniform now.
  // Empty: the step's logits come back and the host samples.
  std::vector<SampleRow> device_rows(const SchedulerOutput& out) {
    std::vector<SampleRow> rows;
    if (!device_sampling_) return rows;
    for (const auto& s : out.seqs) {
      const RequestState& st = *states_.at(static_cast<uint64_t>(s.seq->id));
      if (s.samples && (s.num_draft > 0 || st.sampler.device_refusal(banned_tokens(st)) != nullptr)) return rows;
    }
    for (const auto& s : out.seqs) {
      if (s.samples) rows.push_back(states_.at(static_cast<uint64_t>(s.seq->id))->sampler.device_row());
    }
    return rows;
  }

  // Samples (and, with drafts, verifies) the tokens of one sampling sequence from its logits rows starting at
  // `row`, or takes `device_token` (>= 0) drawn on the device, streams them as one event, and rolls back rejected
  // drafts; returns true when the request is finished.
  bool emit_tokens(RequestState& st, const ScheduledSeq& s, size_t row, EngineClock::time_point now, int32_t device_token) {
    Sequence& seq = st.seq;
    std::vector<int32_t> draft;
    if (s.num_draft > 0) {
      draft.assign(seq.tokens.end() - s.num_draft, seq.tokens.end());
      seq.tokens.resize(seq.tokens.size() - static_cast<size_t>(s.num_draft));
    }
    TokenEvent e;
    e.request_id = static_cast<uint64_t>(seq.id);
    bool finished = false;
    int64_t accepted = 0;
    if (device_token >= 0) {
      SampleResult r;
      r.token = device_token;
      st.sampler.accept(r.token);
      finished = push_token(st, r, e);
    } else {
      accepted = verify_draft(
          st.sampler, draft, [&](size_t j) { return runner_->logits(row + j); }, [&] { return banned_tokens(st); },
          [&](SampleResult& r) { return finished = push_token(st, r, e); }, draft_probs_of(st, s.num_draft));
    }
    generation_tokens_ += static_cast<int64_t>(e.token_ids.size());
    if (s.num_draft > 0) {
      ++st.spec_num_drafts;
      st.spec_draft_tokens += s.num_draft;
      st.spec_accepted_tokens += accepted;
      ++spec_num_drafts_;
      spec_draft_tokens_ += s.num_draft;
      spec_accepted_tokens_ += accepted;
      if (spec_accepted_per_position_.size() < static_cast<size_t>(s.num_draft)) {
        spec_accepted_per_position_.resize(static_cast<size_t>(s.num_draft), 0);
      }
      for (int64_t i = 0; i < accepted; ++i) ++spec_accepted_per_position_[static_cast<size_t>(i)];
      if (!finished) {
        scheduler_->accept_draft(&seq, accepted);
        speculator_->rollback(seq.id, seq.tokens);
      }
    }
    e.time = now;
    e.usage = usage_of(st);
    outbox_.emplace_back(st.stream, std::move(e));
    return finished;
  }

  // The draft distributions of the first `num_draft` drafts of `st` (empty for deterministic drafts).
  std::span<const float> draft_probs_of(const RequestState& st, int64_t num_draft) const {
    if (st.draft_probs.empty() || num_draft == 0) return {};
    return std::span<const float>(st.draft_probs).first(static_cast<size_t>(num_draft * model_config_.vocab));
  }

  // Proposes speculative drafts for every decoding sequence in one batched call (the scheduler takes what fits
  // this step). A failing draft model fails the requests it was drafting for.
  void propose_drafts() {
    if (!speculator_) return;
    std::vector<DraftSlot> slots;
    for (auto& [id, st] : states_) {
      Sequence& seq = st->seq;
      st->draft_probs.clear();
      if (seq.status != SeqStatus::kRunning || seq.num_uncomputed() != 1) continue;
      const int64_t room = std::min(num_draft_tokens_, seq.max_total_len - seq.size() - 1);
      if (room <= 0) continue;
      slots.push_back({seq.id, seq.tokens, room, &st->params, st->draft_seed, &seq.draft, &st->draft_probs});
    }
    if (slots.empty()) return;
    try {
      speculator_->propose(slots);
    } catch (const std::exception& ex) {
      for (const DraftSlot& slot : slots) {
        const auto id = static_cast<uint64_t>(slot.seq_id);
        finish(*states_[id], FinishReason::kError, std::string("speculative draft failed: ") + ex.what());
        remove(id);
      }
    }
  }

  void remove(uint64_t id) {
    auto it = states_.find(id);
    scheduler_->remove(&it->second->seq);
    if (speculator_) speculator_->release(static_cast<int64_t>(id));
    states_.erase(it);
    std::lock_guard lock(mutex_);
    live_ids_.erase(id);
  }

  void loop() {
    for (;;) {
      std::vector<std::unique_ptr<RequestState>> incoming;
      std::vector<uint64_t> aborts;
      bool stopping = false;
      {
        std::unique_lock lock(mutex_);
        const auto ready = [&] { return stopping_ || !pending_.empty() || !aborts_.empty() || scheduler_->has_work(); };
        if (keep_alive_.count() == 0) {
          cv_.wait(lock, ready);
        } else if (!cv_.wait_for(lock, keep_alive_, ready)) {
          lock.unlock();
          keep_alive();
          continue;
        }
        incoming.swap(pending_);
        aborts.swap(aborts_);
        stopping = stopping_;
      }
      for (auto& st : incoming) {
        Sequence* seq = &st->seq;
        states_.emplace(static_cast<uint64_t>(seq->id), std::move(st));
        scheduler_->add(seq);
      }
      for (uint64_t id : aborts) {
        auto it = states_.find(id);
        if (it == states_.end()) continue;
        finish(*it->second, FinishReason::kAbort);
        remove(id);
        ++aborted_;
      }
      if (stopping) {
        std::vector<uint64_t> ids;
        for (const auto& [id, st] : states_) ids.push_back(id);
        for (uint64_t id : ids) {
          finish(*states_[id], FinishReason::kAbort);
          remove(id);
          ++aborted_;
        }
        publish_stats(0, 0);
        deliver();
        return;
      }
      if (!aborts.empty()) publish_stats(0, 0);
      step();
      deliver();
    }
  }

  // Tells idle worker processes the engine is still there; a failure leaves the group broken, and the next step
  // reports it to its requests.
  void keep_alive() {
    try {
      ranks_->keep_alive();
    } catch (const std::exception&) {
      keep_alive_ = std::chrono::milliseconds(0);
    }
  }

  void step() {
    propose_drafts();
    SchedulerOutput out = scheduler_->schedule();
    preemptions_ += static_cast<int64_t>(out.preempted.size());
    if (speculator_) {
      for (const Sequence* seq : out.preempted) speculator_->release(seq->id);
    }
    if (out.empty()) {
      publish_stats(0, 0);
      if (scheduler_->num_running() == 0 && scheduler_->num_waiting() > 0) {
        // Cannot happen with validated requests (each fits the cache alone); fail them rather than spin.
        std::vector<uint64_t> ids;
        for (const auto& [id, st] : states_) ids.push_back(id);
        for (uint64_t id : ids) {
          finish(*states_[id], FinishReason::kError, "the request cannot be scheduled with the current KV cache");
          remove(id);
        }
      }
      return;
    }
    std::vector<SampleRow> rows;
    try {
      const auto start = EngineClock::now();
      rows = device_rows(out);
      if (rows.empty()) runner_->run(out);
      else runner_->run_sampled(out, rows);
      forward_seconds_ += std::chrono::duration<double>(EngineClock::now() - start).count();
    } catch (const std::exception& ex) {
      for (const auto& s : out.seqs) {
        const auto id = static_cast<uint64_t>(s.seq->id);
        finish(*states_[id], FinishReason::kError, std::string("engine step failed: ") + ex.what());
        remove(id);
      }
      return;
    }
    scheduler_->complete(out);
    const auto now = EngineClock::now();
    size_t row = 0;
    std::vector<uint64_t> done;
    for (const auto& s : out.seqs) {
      RequestState& st = *states_[static_cast<uint64_t>(s.seq->id)];
      if (!st.admitted) {
        st.cached_tokens = s.seq->num_prefix_hit;
        st.admitted = true;
      }
      const int64_t first = s.seq->num_computed - (s.num_tokens - s.num_draft);
      prompt_tokens_ += std::clamp<int64_t>(s.seq->prompt_len - first, 0, s.num_tokens);
      if (!s.samples) continue;
      try {
        if (emit_tokens(st, s, row, now, rows.empty() ? -1 : runner_->token(row))) done.push_back(static_cast<uint64_t>(s.seq->id));
      } catch (const std::exception& ex) {
        finish(st, FinishReason::kError, std::string("sampling failed: ") + ex.what());
        done.push_back(static_cast<uint64_t>(s.seq->id));
      }
      row += 1 + static_cast<size_t>(s.num_draft);
    }
    for (uint64_t id : done) {
      remove(id);
      ++finished_;
    }
    publish_stats(static_cast<int64_t>(out.seqs.size()), out.num_tokens);
  }

  void publish_stats(int64_t seqs, int64_t tokens) {
    if (tokens > 0) {
      ++steps_;
      batched_tokens_ += tokens;
      running_sum_ += seqs;
      max_batch_ = std::max(max_batch_, tokens);
    }
    EngineStats s;
    s.running = scheduler_->num_running();
    s.waiting = scheduler_->num_waiting();
    s.kv_blocks_total = blocks_->num_blocks();
    s.kv_blocks_free = blocks_->num_free_blocks();
    s.kv_blocks_used = blocks_->num_used_blocks();
    s.page_size = blocks_->page_size();
    s.kv_usage = static_cast<double>(s.kv_blocks_used) / static_cast<double>(s.kv_blocks_total);
    s.prefix_query_tokens = blocks_->prefix_query_tokens();
    s.prefix_hit_tokens = blocks_->prefix_hit_tokens();
    s.prefix_cache_hit_rate = s.prefix_query_tokens > 0 ? static_cast<double>(s.prefix_hit_tokens) / static_cast<double>(s.prefix_query_tokens) : 0.0;
    s.steps = steps_;
    s.batched_tokens = batched_tokens_;
    s.max_batch_tokens = max_batch_;
    s.mean_batch_tokens = steps_ > 0 ? static_cast<double>(batched_tokens_) / static_cast<double>(steps_) : 0.0;
    s.mean_running = steps_ > 0 ? static_cast<double>(running_sum_) / static_cast<double>(steps_) : 0.0;
    s.prompt_tokens = prompt_tokens_;
    s.generation_tokens = generation_tokens_;
    s.requests_finished = finished_;
    s.requests_aborted = aborted_;
    s.preemptions = preemptions_;
    s.forward_seconds = forward_seconds_;
    s.comm_seconds = ranks_->comm_seconds();
    s.comm_wait_seconds = ranks_->comm_wait_seconds();
    s.spec_num_drafts = spec_num_drafts_;
    s.spec_draft_tokens = spec_draft_tokens_;
    s.spec_accepted_tokens = spec_accepted_tokens_;
    s.spec_accepted_per_position = spec_accepted_per_position_;
    s.spec_acceptance_rate = spec_draft_tokens_ > 0 ? static_cast<double>(spec_accepted_tokens_) / static_cast<double>(spec_draft_tokens_) : 0.0;
    s.spec_draft_kv_blocks_used = speculator_ ? speculator_->kv_blocks_used() : 0;
    s.spec_mean_accepted_length = spec_num_drafts_ > 0 ? 1.0 + static_cast<double>(spec_accepted_tokens_) / static_cast<double>(spec_num_drafts_) : 0.0;
    std::lock_guard lock(stats_mutex_);
    stats_ = s;
  }

  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Speculator> speculator_;
  int64_t num_draft_tokens_ = 0;
  std::chrono::milliseconds keep_alive_{0};  // engine thread only after construction

  mutable std::mutex mutex_;  // guards the fields below up to thread_
  std::condition_variable cv_;
  std::vector<std::unique_ptr<RequestState>> pending_;
  std::vector<uint64_t> aborts_;
  std::unordered_set<uint64_t> live_ids_;
  bool stopping_ = false;
  bool device_sampling_ = false;  // steps whose requests allow it draw their tokens on the device (GPU, one rank)
  std::thread thread_;

  std::unordered_map<uint64_t, std::unique_ptr<RequestState>> states_;  // engine thread only
  std::vector<std::pair<std::shared_ptr<RequestStream>, TokenEvent>> outbox_;
  int64_t steps_ = 0, batched_tokens_ = 0, running_sum_ = 0, max_batch_ = 0;
  double forward_seconds_ = 0.0;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, finished_ = 0, aborted_ = 0, preemptions_ = 0;
  int64_t spec_num_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;
  std::vector<int64_t> spec_accepted_per_position_;
  mutable std::mutex stats_mutex_;
  EngineStats stats_;
};

EngineReplica::EngineReplica(const EngineConfig& config) : impl_(std::make_unique<Impl>(config)) {}
EngineReplica::~EngineReplica() { shutdown(); }
PreparedRequest EngineReplica::prepare(Request request) const { return impl_->prepare(std::move(request)); }
std::shared_ptr<RequestStream> EngineReplica::enqueue(uint64_t id, PreparedRequest request, std::function<void()> notify) {
  return impl_->enqueue(id, std::move(request), std::move(notify));
}
bool EngineReplica::abort(uint64_t id) { return impl_->abort(id); }
EngineStats EngineReplica::stats() const { return impl_->stats(); }
int64_t EngineReplica::num_live() const { return impl_->num_live(); }
const ModelConfig& EngineReplica::model_config() const { return impl_->model_config_; }
const Tokenizer& EngineReplica::tokenizer() const { return *impl_->tokenizer_; }
int64_t EngineReplica::kv_capacity_tokens() const { return impl_->kv_capacity_tokens(); }
void EngineReplica::shutdown() {
  if (impl_) impl_->shutdown();
}

}  // namespace servetune
