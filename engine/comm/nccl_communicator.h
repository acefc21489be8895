// The `nccl` backend: ranks are GPUs (one per process), buffers are device memory. Rank 0 publishes the NCCL
// unique id through a TcpStore at dist_init_addr (SGLang's multi-node bootstrap); collectives run on the
// communicator's own stream and are waited for with the group's timeout (NCCL's non-blocking mode, so a
// missing peer aborts the communicator instead of hanging). Built only with -DSERVETUNE_WITH_NCCL=ON.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace servetune {

std::unique_ptr<Communicator> make_nccl_communicator(const CommSpec& spec);

}  // namespace servetune
