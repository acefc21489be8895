// The Engine front: validates the config, starts dp_size replicas (each a full engine with its share of the
// threads, KV capacity and running-request limit), gives every request a global id and a replica chosen by the
// load-balance method, and aggregates the replicas' stats. With dp_size 1 it forwards to a single replica. With DP
// attention the replicas are the tp_size ranks themselves (attention on one rank each), joined by one communicator
// for their MoE layers (model/parallel.h): threads of this process, or with gloo worker processes whose replicas'
// schedulers still run here (tensor_parallel_group.h).
#include "servetune/engine.h"

#include <algorithm>
#include <thread>

#include "core/cpu_features.h"
#include "comm/local_communicator.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model_config.h"
#include "runtime/engine_replica.h"
#include "runtime/kv_plan.h"
#include "runtime/replica_router.h"
#include "runtime/step_channel.h"
#include "runtime/worker_launcher.h"

namespace servetune {
namespace {

// DP attention over processes (gloo): every replica's scheduler runs here, replica 0's model too; the others' models
// are worker processes (this node's other local ranks, and other nodes).
bool replicas_in_processes(const EngineConfig& config) {
  return config.enable_dp_attention && config.comm_backend == CommBackend::kGloo;
}

// Replica `index` of `dp`: threads split as evenly as possible (the first ones take the remainder); KV capacity
// (max_total_tokens or mem_fraction_static) and max_running_requests are the whole engine's, divided by dp. Replicas
// in processes: this process's threads and memory are replica 0's share of its node (the node's other ranks are
// worker processes; a remote replica here runs no model).
EngineConfig replica_config(const EngineConfig& config, int index) {
  EngineConfig c = config;
  const int dp = config.dp_size;
  c.dp_size = 1;
  if (config.enable_dp_attention) c.tp_size = 1;  // dp_size = tp_size: each replica's attention is one rank's
  if (dp == 1) return c;
  const int sharing = replicas_in_processes(config) ? ranks_per_node(config) : dp;
  const int available = config.threads > 0 ? config.threads : available_cpus();
  if (replicas_in_processes(config)) c.threads = index == 0 ? std::max(1, available / sharing) : 1;
  else c.threads = available / dp + (index < available % dp ? 1 : 0);
  if (config.max_total_tokens) c.max_total_tokens = *config.max_total_tokens / dp;
  else c.mem_fraction_static = (config.mem_fraction_static > 0 ? config.mem_fraction_static : kCpuDefaultMemFraction) / sharing;
  c.max_running_requests = std::max(1, config.max_running_requests / dp);
  return c;
}

// DP attention: each replica's links to the others (none without it). In processes, the MoE group (replica 0 here,
// the workers' ranks elsewhere) meets at dist_init_addr before each worker's channel at the ports after it; the
// lockstep is among this process's threads.
std::vector<ReplicaLinks> replica_links(const EngineConfig& config) {
  std::vector<ReplicaLinks> links(static_cast<size_t>(config.dp_size));
  if (!config.enable_dp_attention) return links;
  const std::chrono::milliseconds timeout = std::chrono::seconds(config.dist_timeout);
  const auto group = LocalGroup::create(config.dp_size, timeout);
  if (!replicas_in_processes(config)) {
    for (int i = 0; i < config.dp_size; ++i) links[static_cast<size_t>(i)].moe = group->communicator(i);
    return links;
  }
  CommSpec spec = node_rank_spec(config.tp_size, config.nnodes, 0, 0, config.dist_init_addr);
  spec.timeout = timeout;
  links[0].moe = make_communicator("gloo", spec);
  for (int i = 0; i < config.dp_size; ++i) {
    ReplicaLinks& l = links[static_cast<size_t>(i)];
    l.sync = group->communicator(i);
    if (i > 0) l.worker = make_communicator("gloo", replica_channel_spec(config.dist_init_addr, i, true, timeout));
  }
  return links;
}

EngineConfig validated(const EngineConfig& config) {
  config.validate();
  if (config.node_rank > 0) {
    throw_usage("node_rank " + std::to_string(config.node_rank) + " is a tensor-parallel worker, not an engine: start it with "
                "`servetune serve ... --node-rank " + std::to_string(config.node_rank) + "` (node_rank 0 runs the engine)");
  }
  return config;
}

}  // namespace

class Engine::Impl {
 public:
  explicit Impl(const EngineConfig& config) : config_(validated(config)), router_(config.load_balance_method) {
    if (replicas_in_processes(config_)) local_workers_ = start_local_workers(config_);
    std::vector<ReplicaLinks> links = replica_links(config_);
    for (int i = 0; i < config_.dp_size; ++i) {
      replicas_.push_back(std::make_unique<EngineReplica>(replica_config(config_, i), std::move(links[static_cast<size_t>(i)])));
    }
  }

  std::shared_ptr<RequestStream> submit(Request request, std::function<void()> notify) {
    PreparedRequest prepared = replicas_.front()->prepare(std::move(request));
    // One lock over choice and queueing, so the next choice already counts this request.
    std::lock_guard lock(route_mutex_);
    size_t index = 0;
    if (replicas_.size() > 1) {
      std::vector<ReplicaLoad> loads;
      for (const auto& r : replicas_) loads.push_back(ReplicaLoad{r->num_live(), r->stats().kv_blocks_free});
      index = router_.choose(loads);
    }
    auto stream = replicas_[index]->enqueue(next_id_, std::move(prepared), std::move(notify));
    ++next_id_;
    return stream;
  }

  bool abort(uint64_t id) {
    // Only the replica holding the request knows it; the others answer false.
    for (const auto& r : replicas_) {
      if (r->abort(id)) return true;
    }
    return false;
  }

  EngineStats stats() const {
    if (replicas_.size() == 1) return replicas_.front()->stats();
    EngineStats sum;
    for (const auto& r : replicas_) sum.add_replica(r->stats());
    return sum;
  }

  void shutdown() {
    for (const auto& r : replicas_) r->shutdown();
  }

  // Each replica counts its own tokens; with DP attention replica 0 counts every replica's and the others nothing.
  std::vector<std::vector<int64_t>> expert_distribution() const {
    std::vector<std::vector<int64_t>> sum;
    for (const auto& r : replicas_) {
      const auto d = r->expert_distribution();
      if (sum.empty()) {
        sum = d;
        continue;
      }
      for (size_t l = 0; l < d.size() && l < sum.size(); ++l) {
        for (size_t e = 0; e < d[l].size() && e < sum[l].size(); ++e) sum[l][e] += d[l][e];
      }
    }
    return sum;
  }

  EngineConfig config_;
  std::vector<std::unique_ptr<WorkerProcess>> local_workers_;  // outlive the replicas, whose end stops them
  std::vector<std::unique_ptr<EngineReplica>> replicas_;

 private:
  std::mutex route_mutex_;
  ReplicaRouter router_;
  uint64_t next_id_ = 1;
};

Engine::Engine(const EngineConfig& config) : impl_(std::make_unique<Impl>(config)) {}
Engine::~Engine() { shutdown(); }
std::shared_ptr<RequestStream> Engine::submit(Request request, std::function<void()> notify) {
  return impl_->submit(std::move(request), std::move(notify));
}
bool Engine::abort(uint64_t id) { return impl_->abort(id); }
EngineStats Engine::stats() const { return impl_->stats(); }
int64_t Engine::flush_prefix_cache() {
  int64_t flushed = 0;
  for (const auto& r : impl_->replicas_) flushed += r->flush_prefix_cache();
  return flushed;
}
std::vector<std::vector<int64_t>> Engine::expert_distribution() const { return impl_->expert_distribution(); }
const EngineConfig& Engine::config() const { return impl_->config_; }
const ModelConfig& Engine::model_config() const { return impl_->replicas_.front()->model_config(); }
ModelInfo Engine::model_info() const { return model_info_of(model_config()); }
const Tokenizer& Engine::tokenizer() const { return impl_->replicas_.front()->tokenizer(); }
int64_t Engine::kv_capacity_tokens() const { return impl_->replicas_.front()->kv_capacity_tokens(); }
std::string Engine::cpu_isa() const { return std::string(cpu_isa_name(cpu_selected_isa())); }
void Engine::shutdown() {
  if (impl_) impl_->shutdown();
}

}  // namespace servetune
