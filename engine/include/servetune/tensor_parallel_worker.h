// Tensor-parallel worker processes (comm_backend gloo, public API): the entry point a worker process runs, and the
// hook through which a program that can start itself as a worker registers how. A worker never sees a request: the
// scheduler, tokenizer and sampler run on rank 0 only.
#pragma once

#include <functional>
#include <memory>

#include "servetune/engine_config.h"

namespace servetune {

// Runs this process as local rank `local_rank` of node node_rank (global rank node_rank * tp_size / nnodes +
// local_rank) of the group `config` describes (validated here): loads its shard of the model, joins rank 0's group
// and runs every Batch rank 0 sends into its own KV cache shard until rank 0 sends shutdown. Local rank 0 of a node
// first starts the node's other local ranks through the registered launcher. Throws Error(kUsage) when that is rank 0
// (the engine) or the model differs from rank 0's, and Error(kIo) when rank 0 never arrives or the group fails (rank 0
// or another worker gone) within dist_timeout.
void run_tensor_parallel_worker(const EngineConfig& config, int local_rank = 0);

// A started worker process; destroying it waits for the process to end (it does once rank 0 shuts the group down
// or the group fails), killing it if it has not within a grace period.
class WorkerProcess {
 public:
  virtual ~WorkerProcess() = default;
};

// Starts local rank `local_rank` (1 .. tp_size / nnodes - 1) of this node's config as a process that runs
// run_tensor_parallel_worker(config, local_rank). The library cannot start a program by itself (it does not know
// which binary offers the worker entry point), so a program that does registers its launcher at start-up.
using WorkerLauncher = std::function<std::unique_ptr<WorkerProcess>(const EngineConfig& config, int local_rank)>;

void set_worker_launcher(WorkerLauncher launcher);

}  // namespace servetune
