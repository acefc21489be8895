// Starting a node's other tensor-parallel ranks as processes (comm_backend gloo with tp_size / nnodes > 1 ranks per
// node), through the launcher a program registers with set_worker_launcher (servetune/tensor_parallel_worker.h).
#pragma once

#include <memory>
#include <vector>

#include "servetune/engine_config.h"
#include "servetune/tensor_parallel_worker.h"

namespace servetune {

// Tensor-parallel ranks one node process hosts: tp_size / nnodes with gloo, all of them otherwise.
int ranks_per_node(const EngineConfig& config);

// Starts this node's local ranks 1 .. ranks_per_node - 1 (none with one rank per node). Throws Error(kUsage) when
// there are some to start and no launcher is registered.
std::vector<std::unique_ptr<WorkerProcess>> start_local_workers(const EngineConfig& config);

}  // namespace servetune
