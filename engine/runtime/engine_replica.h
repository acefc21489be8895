// One engine replica: a complete engine (model, KV cache, scheduler, engine thread) serving the requests the
// Engine front routes to it. The front assigns request ids; a replica never sees data-parallel settings.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "servetune/engine.h"

namespace servetune {

class Communicator;

// A request checked and tokenized, ready to be queued on any replica of the same model.
struct PreparedRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  bool detokenize = true;
  bool prompt_logits = false;
};

// DP attention: how a replica joins the others (all null without it).
struct ReplicaLinks {
  std::unique_ptr<Communicator> moe;     // its rank among all replicas, which its MoE layers span (model here)
  std::unique_ptr<Communicator> sync;    // the replicas' lockstep, when `moe` is another process's group (null: over moe)
  std::unique_ptr<Communicator> worker;  // or: its model is in a worker process, reached over this channel
};

class EngineReplica {
 public:
  // `config` is this replica's share (threads, KV capacity, running requests); it is not validated again here.
  explicit EngineReplica(const EngineConfig& config, ReplicaLinks links = {});
  ~EngineReplica();
  EngineReplica(const EngineReplica&) = delete;
  EngineReplica& operator=(const EngineReplica&) = delete;

  // Checks and tokenizes a request; throws Error(kInvalidRequest) as Engine::submit documents. Thread-safe.
  PreparedRequest prepare(Request request) const;
  // Queues it under the id the front chose (unique across replicas); throws Error(kUsage) after shutdown.
  std::shared_ptr<RequestStream> enqueue(uint64_t id, PreparedRequest request, std::function<void()> notify);
  bool abort(uint64_t id);  // false when this replica does not hold the request (any more)
  int64_t flush_prefix_cache();
  EngineStats stats() const;
  std::vector<std::vector<int64_t>> expert_distribution() const;  // rank 0's counters (Model::expert_distribution)
  int64_t num_live() const;  // requests submitted here and not finished yet (queued ones included)
  const ModelConfig& model_config() const;
  const Tokenizer& tokenizer() const;
  int64_t kv_capacity_tokens() const;
  void shutdown();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace servetune
