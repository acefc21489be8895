// A tensor-parallel worker process (comm_backend gloo, node_rank > 0): loads its shard of the model, joins rank 0's
// group, and runs every Batch rank 0 sends into its own KV cache shard until rank 0 shuts the group down. It never
// sees a request: the scheduler, tokenizer and sampler run on rank 0 only.
#pragma once

#include "servetune/engine_config.h"

namespace servetune {

// Runs this process as local rank `local_rank` of node node_rank (global rank node_rank * tp_size / nnodes +
// local_rank) of the group `config` describes (validated here) until rank 0 sends shutdown; local rank 0 of a node
// starts the node's other local ranks (worker_launcher.h). Throws Error(kUsage) when that is rank 0 (the engine) or
// the model differs from rank 0's, and Error(kIo) when rank 0 never arrives or the group fails (rank 0 or another
// worker gone) within dist_timeout.
void run_tensor_parallel_worker(const EngineConfig& config, int local_rank = 0);

}  // namespace servetune
