// The worker process loop of a multi-process tensor-parallel group (see servetune/tensor_parallel_worker.h).
#include "servetune/tensor_parallel_worker.h"

#include <algorithm>
#include <thread>

#include "backend/backend.h"
#include "comm/timed_communicator.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/checkpoint.h"
#include "runtime/step_channel.h"
#include "runtime/tensor_parallel_group.h"
#include "runtime/worker_launcher.h"
#include "servetune/engine_setting_enums.h"

namespace servetune {
namespace {

// DP attention: this rank is attention replica `spec.rank`, whose scheduler and sampler run in the engine's process.
// Its MoE layers span every replica over the gloo group at dist_init_addr; its steps arrive over its own channel
// with the engine, and each step's logits rows and expert counters go back over it.
void serve_attention_replica(const EngineConfig& config, const CommSpec& spec, int threads) {
  const auto moe = make_communicator("gloo", spec);
  const auto channel_comm = make_communicator("gloo", replica_channel_spec(config.dist_init_addr, spec.rank, false, spec.timeout));
  StepChannel channel(*channel_comm);
  const Checkpoint checkpoint(config.model, config.load_format, config.seed);
  auto backend = make_backend(to_string(config.device), threads);
  const ParallelContext parallel =
      ParallelContext{0, 1, nullptr, 1, moe.get(), config.moe_a2a_backend == MoeA2aBackend::kDeepep}.with_experts(expert_split(config));
  auto model = checkpoint.load(*backend, parallel, compile_options(config));
  const KvLayout layout = channel.receive_handshake(model_fingerprint(model->config(), model->parallel()));
  KvStorage kv(*backend, model->config(), model->local_kv_heads(), layout.num_blocks, layout.page_size, layout.dtype);

  Batch batch;
  KvMove move;
  std::vector<float> logits, hidden;
  for (;;) {
    const RankMessage message = channel.receive({}, batch, move);
    if (message == RankMessage::kShutdown) return;
    if (message == RankMessage::kMoveKv) kv.copy_slots(*backend, move.from, move.to);
    if (message != RankMessage::kStep) continue;
    try {
      model->forward(batch, kv, logits);
    } catch (const std::exception& ex) {
      const std::string reason = "replica " + std::to_string(spec.rank) + " failed: " + ex.what();
      moe->abort(reason);  // the other replicas fail their step at once
      channel_comm->abort(reason);
      throw;
    }
    const auto rows = model->hidden_rows();  // for a draft head in the engine process
    hidden.assign(batch.return_hidden ? rows.begin() : rows.end(), rows.end());
    channel.send_reply(logits, model->expert_load(), hidden);
  }
}

}  // namespace

void run_tensor_parallel_worker(const EngineConfig& config, int local_rank) {
  config.validate();
  if (config.comm_backend != CommBackend::kGloo || (config.node_rank == 0 && local_rank == 0)) {
    throw_usage("a tensor-parallel worker runs with comm_backend gloo and node_rank > 0 (node_rank 0 runs the engine)");
  }
  const int local_ranks = ranks_per_node(config);
  if (local_rank < 0 || local_rank >= local_ranks) {
    throw_usage("local rank " + std::to_string(local_rank) + " is outside the node's " + std::to_string(local_ranks) + " ranks");
  }
  const auto local_workers = local_rank == 0 ? start_local_workers(config) : std::vector<std::unique_ptr<WorkerProcess>>{};
  CommSpec spec = node_rank_spec(config.tp_size, config.nnodes, config.node_rank, local_rank, config.dist_init_addr);
  spec.timeout = std::chrono::seconds(config.dist_timeout);
  const int node_threads = config.threads > 0 ? config.threads : available_cpus();
  const int threads = std::max(1, node_threads / local_ranks);
  if (config.enable_dp_attention) {
    serve_attention_replica(config, spec, threads);
    return;
  }
  auto raw = make_communicator("gloo", spec);
  Communicator& channel_comm = *raw;
  TimedCommunicator comm(std::move(raw));
  StepChannel channel(channel_comm);

  const Checkpoint checkpoint(config.model, config.load_format, config.seed);
  auto backend = make_backend(to_string(config.device), threads);
  const ParallelContext parallel = ParallelContext{spec.rank, config.tp_size, &comm}.with_experts(expert_split(config));
  auto model = checkpoint.load(*backend, parallel, compile_options(config));
  const KvLayout layout = channel.receive_handshake(model_fingerprint(model->config(), model->parallel()));
  KvStorage kv(*backend, model->config(), model->local_kv_heads(), layout.num_blocks, layout.page_size, layout.dtype);

  Batch batch;
  KvMove move;
  std::vector<float> logits;  // every rank gets the gathered logits; rank 0 samples from its copy
  for (;;) {
    const RankMessage message = channel.receive(comm.take_durations(), batch, move);
    if (message == RankMessage::kShutdown) return;
    if (message == RankMessage::kMoveKv) kv.copy_slots(*backend, move.from, move.to);
    if (message != RankMessage::kStep) continue;
    try {
      model->forward(batch, kv, logits);
    } catch (const std::exception& ex) {
      comm.abort("rank " + std::to_string(spec.rank) + " failed: " + ex.what());  // rank 0 fails its step at once
      throw;
    }
  }
}

}  // namespace servetune
