// The engine thread of one replica: admits queued requests and aborts, runs steps (drafts -> schedule -> forward ->
// sample -> token events) and publishes stats. Invariants: request states are touched on the engine thread only; a
// step's events reach their streams after its stats are published; every request gets exactly one final event.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/request_state.h"
#include "servetune/engine.h"

namespace servetune {

class BlockManager;
class ModelRunner;
class Scheduler;
class Speculator;
class TensorParallelGroup;
struct SampleRow;
struct ScheduledSeq;
struct SchedulerOutput;

// What a step works with; all of it outlives the StepLoop.
// DP attention: how long an idle replica waits for work before joining the replicas' next step.
constexpr std::chrono::milliseconds kReplicaPollInterval{2};

struct StepParts {
  TensorParallelGroup* ranks = nullptr;  // device sampling, keep-alive, communication times
  BlockManager* blocks = nullptr;
  Scheduler* scheduler = nullptr;
  ModelRunner* runner = nullptr;
  Speculator* speculator = nullptr;      // null without speculative decoding
  int64_t num_draft_tokens = 0;          // the most drafts a request verifies in one step
  int64_t disable_by_batch_size = 0;     // steps with at least this many decoding requests draft nothing (0: never)
  int64_t vocab = 0;
};

class StepLoop {
 public:
  // Publishes the stats known before the first step (capacity, free blocks) and starts the engine thread.
  explicit StepLoop(const StepParts& parts);
  ~StepLoop();  // shutdown()
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // Thread-safe. enqueue throws Error(kUsage) after shutdown; abort is false when the request is not here (any more).
  void enqueue(std::unique_ptr<RequestState> state);
  bool abort(uint64_t id);
  // Forgets the prefix cache's free blocks on the engine thread, between steps; returns the blocks forgotten once
  // done (0 after shutdown).
  int64_t flush_prefix_cache();
  int64_t num_live() const;  // requests enqueued and not finished yet (queued ones included)
  EngineStats stats() const;
  // Stops accepting requests, aborts the ones in flight (their final events delivered), joins the thread.
  void shutdown();

 private:
  void loop();
  void keep_alive();
  void step();
  bool step_with_replicas(bool stopping);
  SchedulerOutput plan();
  void execute(const SchedulerOutput& out);
  void nothing_scheduled();
  void fail_step(const SchedulerOutput& out, const std::string& error);
  void abort_all();
  std::vector<SampleRow> device_rows(const SchedulerOutput& out);
  bool emit_tokens(RequestState& st, const ScheduledSeq& s, size_t row, size_t token_offset, EngineClock::time_point now,
                   int32_t device_token, std::vector<float> prompt_logits = {});
  void keep_tree_path(const Sequence& seq, size_t token_offset, std::span<const int32_t> path);
  std::vector<float> take_prompt_logits(RequestState& st, size_t row, int64_t count);
  void propose_drafts();
  void hand_hidden_states(const SchedulerOutput& out);
  void finish(RequestState& st, FinishReason reason, const std::string& error = {});
  void remove(uint64_t id);
  void publish_stats(int64_t seqs, int64_t tokens);

  int64_t kv_bytes_per_token_ = 0;  // over every rank of this replica
  EngineClock::time_point last_contact_ = EngineClock::now();  // DP attention: the last step or keep-alive sent
  StepParts parts_;
  bool device_sampling_ = false;  // steps whose requests allow it draw their tokens on the device (GPU, one rank)
  std::chrono::milliseconds keep_alive_{0};  // engine thread only after construction

  mutable std::mutex mutex_;  // guards the fields below up to thread_
  std::condition_variable cv_;
  std::vector<std::unique_ptr<RequestState>> pending_;
  std::vector<uint64_t> aborts_;
  uint64_t flushes_asked_ = 0, flushes_done_ = 0;  // flush_prefix_cache requests and completions
  int64_t flushed_blocks_ = 0;                     // by the last completed flush
  std::condition_variable flushed_cv_;
  std::unordered_set<uint64_t> live_ids_;
  bool stopping_ = false;
  std::thread thread_;

  // Engine thread only.
  bool replicas_busy_ = false;
  size_t hidden_width_ = 0;  // the model's hidden size, as the last hand_hidden_states() found it  // DP attention: some replica had a batch at the last step (so no waiting now)
  std::unordered_map<uint64_t, std::unique_ptr<RequestState>> states_;
  EventOutbox outbox_;
  EngineStats counters_;  // the counters; publish_stats adds the gauges

  mutable std::mutex stats_mutex_;
  EngineStats stats_;
};

}  // namespace servetune
