// Rank 0's messages to the worker processes of a multi-process tensor-parallel group, over the group's communicator:
// a handshake (KV layout, model fingerprint), then each step's Batch in a compact form (draft-tree masks included),
// the KV moves of accepted draft-tree paths, keep-alives while idle, and shutdown. A message is one all_gatherv of int64 — rank 0's header, and from every worker the durations of its
// collectives in the previous step (so rank 0 accounts them with no extra collective) — and, for a step, one
// broadcast of the Batch's int32 arrays. Every rank calls the matching function in the same order.
// A DP-attention replica's channel has two ranks, the engine and the replica's worker process: after each step the
// worker sends its logits rows and its model's expert counters back (the engine samples them).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "model/batch.h"
#include "model/model.h"
#include "model/parallel.h"

namespace servetune {

struct ModelConfig;

enum class RankMessage : int64_t { kHandshake = 1, kStep = 2, kKeepAlive = 3, kShutdown = 4, kMoveKv = 5 };

// Cache slots whose K/V every rank copies, from[i] to to[i] in order (KvStorage::copy_slots): an accepted draft-tree
// path moved to consecutive positions.
struct KvMove {
  std::vector<int32_t> from, to;
};

struct KvLayout {
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  DType dtype = DType::kF32;
};

// The model shape and split every rank must share (a worker started with another model, tp_size or ep_size would
// compute garbage). `moe_ranks`: the DP-attention replicas the MoE layers span (0 without DP attention).
int64_t model_fingerprint(const ModelConfig& config, int tp_size, const ExpertSplit& experts, int moe_ranks, bool moe_all_to_all);
int64_t model_fingerprint(const ModelConfig& config, const ParallelContext& parallel);

// DP attention over processes: the channel between the engine (rank 0) and the worker process of replica `replica`
// (1 .. replicas - 1), a gloo group of two whose rendezvous is dist_init_addr's port + `replica` (the replicas' MoE
// group itself meets at dist_init_addr).
CommSpec replica_channel_spec(const std::string& dist_init_addr, int replica, bool engine_side, std::chrono::milliseconds timeout);

class StepChannel {
 public:
  explicit StepChannel(Communicator& comm) : comm_(comm) {}

  // Rank 0 side. Each returns the workers' collective durations (ns) of their previous step, [worker][collective];
  // `previous_collectives` is how many collectives rank 0 ran since its last message (the workers ran as many).
  // The handshake throws Error(kUsage) naming the first worker whose model fingerprint differs from `fingerprint`.
  void send_handshake(const KvLayout& kv, int64_t fingerprint);
  std::vector<std::vector<int64_t>> send_step(const Batch& batch, size_t previous_collectives);
  std::vector<std::vector<int64_t>> send(RankMessage kind, size_t previous_collectives);  // keep-alive or shutdown
  std::vector<std::vector<int64_t>> send_move_kv(const KvMove& move, size_t previous_collectives);

  // Worker side. First the handshake (throws Error(kUsage) when rank 0's fingerprint differs), then messages until
  // kShutdown: each reports `previous_durations` (this rank's collectives since its last message); a step fills
  // `batch`, a KV move `move`.
  KvLayout receive_handshake(int64_t fingerprint);
  RankMessage receive(const std::vector<int64_t>& previous_durations, Batch& batch, KvMove& move);

  // A DP-attention replica's channel, after each step: the worker sends, the engine receives `rows` x `vocab` logits
  // (none for a batch without logits rows) and the expert counters.
  // `hidden`: the step's final hidden states when its batch asked for them (Batch::return_hidden), else empty.
  void send_reply(std::vector<float>& logits, const ExpertLoad& load, std::vector<float>& hidden);
  void receive_reply(size_t rows, size_t vocab, std::vector<float>& logits, ExpertLoad& load, size_t hidden_floats,
                     std::vector<float>& hidden);

 private:
  static constexpr size_t kHeader = 6;
  // All-gathers rank 0's header and `worker_count` values from every worker (`mine`: this rank's contribution).
  std::vector<int64_t> exchange(const std::vector<int64_t>& mine, size_t worker_count);
  std::vector<std::vector<int64_t>> worker_values(const std::vector<int64_t>& gathered, size_t worker_count) const;

  Communicator& comm_;
  std::vector<int32_t> payload_;
};

}  // namespace servetune
