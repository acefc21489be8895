// The `gloo` backend: ranks are processes (on one machine or several) connected by gloo's TCP transport.
// Rendezvous goes through a FileStore folder every rank can reach, or a TcpStore served by rank 0.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace servetune {

// Connects this rank to the group described by `spec` (rank, size, timeout, file_store_path or dist_init_addr,
// hostname). Throws Error(kIo) when the peers do not all arrive within the timeout.
std::unique_ptr<Communicator> make_gloo_communicator(const CommSpec& spec);

}  // namespace servetune
