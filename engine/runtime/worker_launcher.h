// Starting a node's other tensor-parallel ranks as processes (comm_backend gloo with tp_size / nnodes > 1 ranks per
// node). The library cannot start a program by itself — it does not know which binary offers the worker entry
// point — so a program that does (servetune's hidden `tp-worker` command) registers a launcher at start-up.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "servetune/engine_config.h"

namespace servetune {

// A started worker process; destroying it waits for the process to end (it does once rank 0 shuts the group down
// or the group fails), killing it if it has not within a grace period.
class WorkerProcess {
 public:
  virtual ~WorkerProcess() = default;
};

// Starts local rank `local_rank` (1 .. tp_size / nnodes - 1) of this node's config as a process that runs
// run_tensor_parallel_worker(config, local_rank).
using WorkerLauncher = std::function<std::unique_ptr<WorkerProcess>(const EngineConfig& config, int local_rank)>;

void set_worker_launcher(WorkerLauncher launcher);

// Tensor-parallel ranks one node process hosts: tp_size / nnodes with gloo, all of them otherwise.
int ranks_per_node(const EngineConfig& config);

// Starts this node's local ranks 1 .. ranks_per_node - 1 (none with one rank per node). Throws Error(kUsage) when
// there are some to start and no launcher is registered.
std::vector<std::unique_ptr<WorkerProcess>> start_local_workers(const EngineConfig& config);

}  // namespace servetune
