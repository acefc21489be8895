// The tensor-parallel ranks of one engine replica: every rank has its own CPU backend, weight shard and KV cache
// shard (its KV heads; the block tables are the replica's, shared). Rank 0 runs on the caller's thread (the engine
// loop). Ranks 1..tp_size-1 are either worker threads joined by a `local` communicator, or worker processes
// (servetune/tensor_parallel_worker.h) joined by a gloo communicator, to which rank 0 sends each step's Batch
// (runtime/step_channel.h); every rank runs the same Batch in lockstep. A failing rank aborts the communicator, so
// the step throws on every rank instead of hanging; the group then stays broken and every later step throws.
// With DP attention (model/parallel.h) the group is one replica's single rank, and a second communicator joins it to
// the other replicas for the MoE layers: every replica steps in lockstep (sync_replicas, forward_idle). Over processes
// (gloo) every replica's scheduler still runs in the engine's process; a replica whose rank is another process is a
// remote group here: no model, each step's Batch sent to its worker process and the logits received back.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "model/batch.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "model/model_config.h"
#include "runtime/step_channel.h"
#include "servetune/collective_kind.h"

namespace servetune {

class Checkpoint;
struct EngineConfig;
class TimedCommunicator;
struct CollectiveRecord;

// The model build options (fused ops, decode graphs) an engine configuration asks for, for every rank's load.
CompileOptions compile_options(const EngineConfig& config);
// The routed experts' split an engine configuration asks for.
ExpertSplit expert_split(const EngineConfig& config);

// What every DP-attention replica learns before a step: whether any replica has a batch (then all run one, an empty
// one where there is none) and whether any is stopping (then all stop).
struct ReplicaSync {
  bool any_batch = false;
  bool stopping = false;
};

class TensorParallelGroup {
 public:
  // Loads every rank's shard of `checkpoint` (sequentially, on this thread); each rank's backend gets
  // `threads_per_rank` threads; the routed experts split over `experts.ep_size` groups of the ranks (model/parallel.h).
  // Throws Error(kUsage) when the model cannot be split tp_size (and ep_size) ways.
  // `replicas` (DP attention, tp_size 1): this replica's communicator among all replicas, which the MoE layers span;
  // `moe_all_to_all`: they dispatch their tokens all-to-all instead of gathering them (ParallelContext); `sync`: the
  // replicas' lockstep when `replicas` spans other processes (null: over `replicas`).
  TensorParallelGroup(const Checkpoint& checkpoint, const std::string& device, int tp_size, int threads_per_rank,
                      CompileOptions compile = {}, std::chrono::milliseconds timeout = kDefaultCommTimeout, ExpertSplit experts = {},
                      std::unique_ptr<Communicator> replicas = nullptr, bool moe_all_to_all = false,
                      std::unique_ptr<Communicator> sync = nullptr);
  // DP attention over processes: a replica whose model and KV cache are in its worker process
  // (run_tensor_parallel_worker), reached over `channel` (replica_channel_spec, this side rank 0); `sync` joins the
  // replicas' lockstep (its size is the number of replicas). The backend (one thread) sizes the KV cache and would
  // run a draft model. The worker checks it loaded the same model split the same ways with `moe_all_to_all`.
  TensorParallelGroup(const Checkpoint& checkpoint, const std::string& device, std::unique_ptr<Communicator> channel,
                      std::unique_ptr<Communicator> sync, std::chrono::milliseconds timeout, const ExpertSplit& experts,
                      bool moe_all_to_all);
  // This process is rank 0 of `comm`'s group (size tp_size); the other ranks are worker processes, told the KV
  // layout by create_kv() and each step by forward(), and stopped when the group is destroyed.
  // `timeout` is the communicator's (the workers' wait for the next message).
  TensorParallelGroup(const Checkpoint& checkpoint, const std::string& device, int threads, std::unique_ptr<Communicator> comm,
                      std::chrono::milliseconds timeout, CompileOptions compile = {}, ExpertSplit experts = {});
  ~TensorParallelGroup();
  TensorParallelGroup(const TensorParallelGroup&) = delete;
  TensorParallelGroup& operator=(const TensorParallelGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }  // ranks in this process
  Backend& backend(int rank) { return *ranks_[static_cast<size_t>(rank)].backend; }
  // A rank's model (none in a remote replica's group).
  Model& model(int rank) { return *ranks_[static_cast<size_t>(rank)].model; }
  // The last forward's final hidden states when its batch asked (Batch::return_hidden): rank 0's model's, or those a
  // remote replica's worker sent back; and whether this group's model keeps them.
  std::span<const float> hidden_rows() const;
  bool supports_hidden() const;
  const ModelConfig& config() const { return config_; }
  // The model's expert counters (a remote replica's as its worker last reported them).
  ExpertLoad expert_load() const;
  // Rank 0's Model::expert_distribution (none for a remote replica, which DP attention's replica 0 counts).
  std::vector<std::vector<int64_t>> expert_distribution() const;
  // Bytes one KV block takes summed over all ranks (replicated KV heads count once per rank holding them).
  int64_t kv_block_bytes(int64_t page_size, DType dtype) const;
  // Allocates every rank's KV cache shard of `num_blocks` blocks; then starts the worker ranks (threads), or
  // checks the worker processes loaded the same model and has them allocate theirs.
  void create_kv(int64_t num_blocks, int64_t page_size, DType dtype);
  KvStorage& kv(int rank) { return *ranks_[static_cast<size_t>(rank)].kv; }  // none in a remote replica's group
  // Every rank's cache (in this process and in worker processes) copies slot move.from[i] to move.to[i], in order:
  // an accepted draft-tree path's K/V moved to consecutive positions.
  void move_kv(const KvMove& move);
  int64_t page_size() const { return kv_layout_.page_size; }  // after create_kv
  DType kv_dtype() const { return kv_layout_.dtype; }

  // Runs `batch` on every rank; `logits` receives the full-vocabulary logits (rank 0's copy). Call from one thread.
  void forward(const Batch& batch, std::vector<float>& logits);
  // Whether forward_sampled() can run: one rank in all, on a backend that samples on the device.
  bool device_sampling() { return tp_size_ == 1 && !channel_ && size() == 1 && model(0).device_sampling(); }
  // Runs `batch` and draws its logits rows' tokens on the device (see Model::forward_sampled).
  void forward_sampled(const Batch& batch, std::span<const SampleRow> rows, std::vector<int32_t>& tokens) {
    model(0).forward_sampled(batch, kv(0), rows, tokens);
  }
  // DP attention: this replica is one of several stepping in lockstep.
  bool dp_attention() const { return sync_ != nullptr; }
  // DP attention, before every step of every replica (a collective): this replica's view in, all replicas' out.
  ReplicaSync sync_replicas(bool has_batch, bool stopping);
  // DP attention: a step with no tokens here while another replica has some (the MoE layers' collectives).
  void forward_idle();
  // How often an idle engine must call keep_alive() so worker processes waiting for the next step do not time out
  // (zero: never).
  std::chrono::milliseconds keep_alive_interval() const;
  void keep_alive();

  // Over all steps: the cost of the communication path itself — per collective, the shortest time any rank spent
  // in it (the last rank to arrive waits for nobody) — and rank 0's further time in collectives, spent waiting for
  // slower ranks (uneven work, OS scheduling). With worker processes, rank 0's time sending the Batch counts as
  // collective time, and the workers' timings arrive with the next message (one step late).
  double comm_seconds() const { return comm_seconds_; }
  double comm_wait_seconds() const { return comm_wait_seconds_; }
  // The model's collectives split by kind: calls, rank 0's payload bytes, and the communication path's time as in
  // comm_seconds() (the sum over kinds is comm_seconds() but for the worker processes' step messages, which are no
  // collective of the model).
  const CollectiveStats& collective_stats() const { return collectives_; }

 private:
  struct Rank {
    std::unique_ptr<Backend> backend;
    TimedCommunicator* comm = nullptr;  // owned by `comm_owner`; null without tensor parallelism
    std::unique_ptr<TimedCommunicator> comm_owner;
    std::unique_ptr<Model> model;
    std::unique_ptr<KvStorage> kv;
    std::vector<float> logits;  // workers' copy of the gathered logits (unused)
    std::thread thread;
  };

  void worker(int rank);
  void account_collectives();
  // Rank 0's records and every other rank's durations ([rank - 1][collective] ns) of the same collectives.
  void account(const std::vector<CollectiveRecord>& own, const std::vector<std::vector<int64_t>>& others);
  void forward_remote(const Batch& batch, std::vector<float>& logits);
  void forward_remote_replica(const Batch& batch, std::vector<float>& logits);
  void stop_remote();
  void stop_workers();

  void forward_own(const Batch& batch, std::vector<float>& logits);

  std::vector<Rank> ranks_;
  ModelConfig config_;
  KvLayout kv_layout_;
  std::unique_ptr<TimedCommunicator> replicas_;  // DP attention with the model here: the MoE layers' group
  std::unique_ptr<Communicator> sync_owner_;     // the lockstep's group when it is not `replicas_`
  Communicator* sync_ = nullptr;                 // DP attention only: the replicas' lockstep
  bool remote_replica_ = false;                  // DP attention: the model is in the worker behind `channel_`
  int64_t remote_fingerprint_ = 0;
  ExpertLoad remote_load_;
  std::vector<float> remote_hidden_;  // a remote replica's last hidden states (Batch::return_hidden)
  int tp_size_ = 1;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<StepChannel> channel_;  // worker processes only
  std::vector<CollectiveRecord> previous_;  // rank 0's collectives since its last message (worker processes)
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const Batch* batch_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr worker_error_;
  double comm_seconds_ = 0.0, comm_wait_seconds_ = 0.0;
  CollectiveStats collectives_{};
};

}  // namespace servetune
