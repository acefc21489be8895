// Rank 0's messages to the worker processes of a multi-process tensor-parallel group, over the group's communicator:
// a handshake (KV layout, model fingerprint), then each step's Batch in a compact form, keep-alives while idle, and
// shutdown. A message is one all_gatherv of int64 — rank 0's header, and from every worker the durations of its
// collectives in the previous step (so rank 0 accounts them with no extra collective) — and, for a step, one
// broadcast of the Batch's int32 arrays. Every rank calls the matching function in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/batch.h"

namespace servetune {

class Communicator;
struct ModelConfig;
struct ParallelContext;

enum class RankMessage : int64_t { kHandshake = 1, kStep = 2, kKeepAlive = 3, kShutdown = 4 };

struct KvLayout {
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  DType dtype = DType::kF32;
};

// The model shape and split every rank must share (a worker started with another model, tp_size or ep_size would
// compute garbage).
int64_t model_fingerprint(const ModelConfig& config, const ParallelContext& parallel);

class StepChannel {
 public:
  explicit StepChannel(Communicator& comm) : comm_(comm) {}

  // Rank 0 side. Each returns the workers' collective durations (ns) of their previous step, [worker][collective];
  // `previous_collectives` is how many collectives rank 0 ran since its last message (the workers ran as many).
  // The handshake throws Error(kUsage) naming the first worker whose model fingerprint differs from `fingerprint`.
  void send_handshake(const KvLayout& kv, int64_t fingerprint);
  std::vector<std::vector<int64_t>> send_step(const Batch& batch, size_t previous_collectives);
  std::vector<std::vector<int64_t>> send(RankMessage kind, size_t previous_collectives);  // keep-alive or shutdown

  // Worker side. First the handshake (throws Error(kUsage) when rank 0's fingerprint differs), then messages until
  // kShutdown: each reports `previous_durations` (this rank's collectives since its last message); a step fills `batch`.
  KvLayout receive_handshake(int64_t fingerprint);
  RankMessage receive(const std::vector<int64_t>& previous_durations, Batch& batch);

 private:
  static constexpr size_t kHeader = 6;
  // All-gathers rank 0's header and `worker_count` values from every worker (`mine`: this rank's contribution).
  std::vector<int64_t> exchange(const std::vector<int64_t>& mine, size_t worker_count);
  std::vector<std::vector<int64_t>> worker_values(const std::vector<int64_t>& gathered, size_t worker_count) const;

  Communicator& comm_;
  std::vector<int32_t> payload_;
};

}  // namespace servetune
