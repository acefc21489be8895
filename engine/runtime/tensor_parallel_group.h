// The tensor-parallel ranks of one engine replica: every rank has its own CPU backend, weight shard and KV cache
// shard (its KV heads; the block tables are the replica's, shared). Rank 0 runs on the caller's thread (the engine
// loop); ranks 1..tp_size-1 are worker threads that run the same Batch in lockstep, joined by a `local` communicator.
// A failing rank aborts the communicator, so the step throws on every rank instead of hanging; the group then stays
// broken and every later step throws.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "model/batch.h"
#include "model/kv_storage.h"
#include "model/model.h"

namespace servetune {

class Checkpoint;
class TimedCommunicator;

class TensorParallelGroup {
 public:
  // Loads every rank's shard of `checkpoint` (sequentially, on this thread); each rank's backend gets
  // `threads_per_rank` threads. Throws Error(kUsage) when the model cannot be split tp_size ways.
  TensorParallelGroup(const Checkpoint& checkpoint, const std::string& device, int tp_size, int threads_per_rank,
                      CompileOptions compile = {});
  ~TensorParallelGroup();
  TensorParallelGroup(const TensorParallelGroup&) = delete;
  TensorParallelGroup& operator=(const TensorParallelGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  Backend& backend(int rank) { return *ranks_[static_cast<size_t>(rank)].backend; }
  Model& model(int rank) { return *ranks_[static_cast<size_t>(rank)].model; }
  // Bytes one KV block takes summed over all ranks (replicated KV heads count once per rank holding them).
  int64_t kv_block_bytes(int64_t page_size, DType dtype) const;
  // Allocates every rank's KV cache shard of `num_blocks` blocks; then starts the worker ranks.
  void create_kv(int64_t num_blocks, int64_t page_size, DType dtype);
  KvStorage& kv(int rank) { return *ranks_[static_cast<size_t>(rank)].kv; }

  // Runs `batch` on every rank; `logits` receives the full-vocabulary logits (rank 0's copy). Call from one thread.
  void forward(const Batch& batch, std::vector<float>& logits);
  // Over all steps: the cost of the communication path itself — per collective, the shortest time any rank spent
  // in it (the last rank to arrive waits for nobody) — and rank 0's further time in collectives, spent waiting for
  // slower ranks (uneven work, OS scheduling).
  double comm_seconds() const { return comm_seconds_; }
  double comm_wait_seconds() const { return comm_wait_seconds_; }

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
  void stop_workers();

  std::vector<Rank> ranks_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const Batch* batch_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::exception_ptr worker_error_;
  double comm_seconds_ = 0.0, comm_wait_seconds_ = 0.0;
};

}  // namespace servetune
