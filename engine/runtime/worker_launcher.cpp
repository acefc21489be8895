// The registered worker launcher and the start of a node's local ranks (see worker_launcher.h).
#include "runtime/worker_launcher.h"

#include <mutex>
#include <string>

#include "core/error.h"

namespace servetune {
namespace {

std::mutex launcher_mutex;
WorkerLauncher& launcher() {
  static WorkerLauncher instance;
  return instance;
}

}  // namespace

void set_worker_launcher(WorkerLauncher l) {
  std::lock_guard lock(launcher_mutex);
  launcher() = std::move(l);
}

int ranks_per_node(const EngineConfig& config) {
  return config.comm_backend == CommBackend::kGloo && config.nnodes > 0 ? config.tp_size / config.nnodes
                                                                         : config.tp_size;
}

std::vector<std::unique_ptr<WorkerProcess>> start_local_workers(const EngineConfig& config) {
  std::vector<std::unique_ptr<WorkerProcess>> started;
  const int local = config.comm_backend == CommBackend::kGloo ? ranks_per_node(config) : 1;
  if (local <= 1) return started;
  WorkerLauncher l;
  {
    std::lock_guard lock(launcher_mutex);
    l = launcher();
  }
  if (!l) {
    throw_usage("tp_size / nnodes = " + std::to_string(local) + " ranks per node need worker processes, which this program "
                "cannot start; use servetune, or set nnodes = tp_size and run each node's process yourself (node_rank > 0: "
                "run_tensor_parallel_worker)");
  }
  for (int r = 1; r < local; ++r) started.push_back(l(config, r));
  return started;
}

}  // namespace servetune
