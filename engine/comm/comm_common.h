// Shared helpers of the communicator backends: argument checks, element-wise reductions, error messages.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace servetune {

// Throws Error(kIo) "communicator <backend> rank R of N: <op>: <what>".
[[noreturn]] void throw_comm_error(const Communicator& comm, const char* op, const std::string& what);
// Throws Error(kUsage) unless `counts` has one entry per rank.
void check_counts(const Communicator& comm, const char* op, const char* name, const std::vector<size_t>& counts);
void check_root(const Communicator& comm, const char* op, int root);
size_t sum_counts(const std::vector<size_t>& counts);
// out[i] = op(out[i], in[i]) for `count` elements.
void reduce_into(void* out, const void* in, size_t count, CommDType dtype, ReduceOp op);

}  // namespace servetune
