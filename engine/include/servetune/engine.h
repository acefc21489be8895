// The built-in engine's public in-process API: submit requests, read their token streams, abort, read stats.
// Thread-safe; each of the dp_size replicas runs its engine loop on its own thread; stats sum over them. The load generator, server and tuner use only this API.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "servetune/collective_kind.h"
#include "servetune/engine_config.h"
#include "servetune/model_info.h"
#include "servetune/request.h"

namespace servetune {

class Tokenizer;     // servetune/tokenizer.h
struct ModelConfig;  // engine-internal (model/model_config.h); API users read model_info()

// The events of one request, in order; the last one has finish != kNone. One consumer.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  // Waits for the next event; nullopt after `timeout`, or when the stream has ended and is drained.
  std::optional<TokenEvent> next(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Takes every event available now without waiting.
  std::deque<TokenEvent> drain();
  bool finished() const;  // the final event has been produced (it may still be queued)
  // Called on the engine thread after events are pushed (e.g. to wake an event loop). Events pushed before it is
  // set do not call it: pass the notifier to Engine::submit, or drain() once after setting it.
  void set_notifier(std::function<void()> notify);

  // Engine side: push() queues an event and notifies; the engine queues a whole step's events with
  // push(e, false) and then notifies each stream once, so a consumer woken by the first notification finds every
  // event of that step already queued.
  void push(TokenEvent event, bool notify = true);
  void notify();

 private:
  uint64_t id_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool finished_ = false;
  std::function<void()> notify_;
};

// Counters and gauges of the engine; the ratios are derived from them by the member functions below, the one place
// that defines them (so a sum over replicas or a difference over a measured run derives them the same way).
struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_free = 0;
  int64_t page_size = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t steps = 0;
  int64_t batched_tokens = 0;          // over all steps
  int64_t batched_seqs = 0;            // over all steps: a sequence counts once in every step it is in
  int64_t max_batch_tokens = 0;
  int64_t prompt_tokens = 0;           // prompt tokens computed (excluding prefix-cache hits)
  int64_t generation_tokens = 0;
  int64_t requests_finished = 0;
  int64_t requests_aborted = 0;
  int64_t preemptions = 0;
  int64_t idle_batches = 0;            // DP attention: steps a replica ran with no tokens of its own (others had some)
  double forward_seconds = 0.0;        // wall time of the model's forward passes, over all steps
  // Tensor-parallel collectives: the communication path's own cost (per collective, the shortest time a rank spent
  // in it) and rank 0's further time in them waiting for slower ranks; both part of forward_seconds.
  double comm_seconds = 0.0;
  double comm_wait_seconds = 0.0;
  // The model's collectives per kind (calls, rank 0's payload bytes, time as in comm_seconds); the worker processes'
  // step messages are in comm_seconds but in no kind.
  CollectiveStats collectives{};
  // Speculative decoding (vLLM's spec_decode counters): a "draft" is one verification of >= 1 draft tokens.
  int64_t spec_num_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;  // [i]: drafts whose token at position i was accepted
  int64_t spec_draft_kv_blocks_used = 0;            // KV blocks the draft model's own cache has in use (draft)
  double spec_draft_seconds = 0.0;  // time proposing drafts (the draft head's forwards): speculation's overhead
  int64_t spec_disabled_steps = 0;  // steps that drafted nothing: speculative_disable_by_batch_size
  int64_t kv_bytes_per_token = 0;  // KV cache bytes one token takes over all layers (per-head K and V, or MLA's latent)
  // Mixture-of-experts load: routed experts (0: a dense model), token-expert assignments over all MoE layers and
  // steps, and per layer and step the most tokens one expert got, summed.
  int64_t moe_experts = 0;
  int64_t moe_routed_tokens = 0;
  int64_t moe_busiest_expert_tokens = 0;
  // Expert parallelism: the expert-parallel groups (ep_size), and per MoE layer and step the assignments of the
  // group (its ranks) with the most, summed.
  int64_t moe_ep_groups = 0;
  int64_t moe_busiest_ep_group_tokens = 0;

  // Ratios, 0 when the denominator is 0.
  double kv_usage() const { return ratio(kv_blocks_used, kv_blocks_total); }
  double prefix_cache_hit_rate() const { return ratio(prefix_hit_tokens, prefix_query_tokens); }
  double mean_batch_tokens() const { return ratio(batched_tokens, steps); }
  double mean_running() const { return ratio(batched_seqs, steps); }  // sequences per step
  double spec_acceptance_rate() const { return ratio(spec_accepted_tokens, spec_draft_tokens); }
  // The busiest expert's tokens against the mean per expert (1: perfectly even; experts at most: all on one).
  double moe_expert_imbalance() const { return ratio(moe_busiest_expert_tokens * moe_experts, moe_routed_tokens); }
  // The busiest expert-parallel group's assignments over the mean per group (1: even; ep_size: all on one group).
  double moe_ep_imbalance() const { return ratio(moe_busiest_ep_group_tokens * moe_ep_groups, moe_routed_tokens); }
  // 1 + accepted / drafts: tokens per verification step.
  double spec_mean_accepted_length() const {
    return spec_num_drafts > 0 ? 1.0 + ratio(spec_accepted_tokens, spec_num_drafts) : 0.0;
  }

  // Adds another replica's stats: counters and gauges sum, max_batch_tokens takes the larger, page_size is shared.
  void add_replica(const EngineStats& other);
  // What the counters grew by since `before`, an earlier snapshot of the same engine (a measured run's share);
  // gauges and max_batch_tokens are this snapshot's.
  EngineStats since(const EngineStats& before) const;

 private:
  static double ratio(int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; }
};

class Engine {
 public:
  // Loads the model and starts the engine thread. Throws Error on a bad config or model.
  explicit Engine(const EngineConfig& config);
  ~Engine();  // shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Throws Error(kInvalidRequest) for a bad request (empty prompt, max_tokens <= 0,
  // prompt + max_tokens beyond the context or the KV capacity) and Error(kUsage) after shutdown.
  // `notify` (optional) becomes the stream's notifier before the request is queued, so no event is missed.
  std::shared_ptr<RequestStream> submit(Request request, std::function<void()> notify = {});
  // Aborts a request; its stream ends with FinishReason::kAbort and its KV blocks are freed within one step.
  // False when the id is unknown or the request already finished.
  bool abort(uint64_t id);
  // Forgets the prefix cache (SGLang's /flush_cache, vLLM's /reset_prefix_cache): every cached block no running
  // request holds; returns once every replica has done so (between two of its steps), with the blocks forgotten.
  // A benchmark calls it between runs so one run's prompts do not warm the next one's cache.
  int64_t flush_prefix_cache();
  EngineStats stats() const;
  // Mixture-of-experts models: assignments per MoE layer (in layer order) and routed expert since the start, over
  // every replica — what init_expert_location's "logical_count" takes. Empty for a dense model. Thread-safe.
  std::vector<std::vector<int64_t>> expert_distribution() const;

  const EngineConfig& config() const;
  const ModelConfig& model_config() const;
  ModelInfo model_info() const;  // the model's shape (servetune/model_info.h)
  const Tokenizer& tokenizer() const;
  int64_t kv_capacity_tokens() const;  // the most tokens one request can hold (one replica's KV when dp_size > 1)
  // The instruction-set level the CPU kernels run with ("avx512", "avx2" or "reference"; SERVETUNE_CPU_ISA forces one).
  std::string cpu_isa() const;

  // Stops accepting requests, aborts the ones in flight, joins the engine thread. Idempotent.
  void shutdown();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace servetune
