// Shared helpers of the communicator backends and the backend-name factory's name table.
#include "comm/comm_common.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "core/error.h"

namespace servetune {

size_t comm_dtype_size(CommDType dtype) {
  switch (dtype) {
    case CommDType::kF32: return 4;
    case CommDType::kI32: return 4;
    case CommDType::kI64: return 8;
  }
  return 0;
}

const char* comm_dtype_name(CommDType dtype) {
  switch (dtype) {
    case CommDType::kF32: return "f32";
    case CommDType::kI32: return "i32";
    case CommDType::kI64: return "i64";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

void throw_comm_error(const Communicator& comm, const char* op, const std::string& what) {
  throw Error(ErrorKind::kIo, std::string("communicator ") + comm.backend() + " rank " + std::to_string(comm.rank()) + " of " +
                                  std::to_string(comm.size()) + ": " + op + ": " + what);
}

void check_counts(const Communicator& comm, const char* op, const char* name, const std::vector<size_t>& counts) {
  if (counts.size() != static_cast<size_t>(comm.size())) {
    throw_usage(std::string(comm.backend()) + " " + op + ": " + name + " has " + std::to_string(counts.size()) +
                " entries, the group has " + std::to_string(comm.size()) + " ranks");
  }
}

void check_root(const Communicator& comm, const char* op, int root) {
  if (root < 0 || root >= comm.size()) {
    throw_usage(std::string(comm.backend()) + " " + op + ": root " + std::to_string(root) + " is not a rank of a group of " +
                std::to_string(comm.size()));
  }
}

CommSpec node_rank_spec(int size, int nnodes, int node_rank, int local_rank, const std::string& dist_init_addr) {
  if (nnodes < 1) throw_usage("nnodes must be at least 1, got " + std::to_string(nnodes));
  if (size < nnodes || size % nnodes != 0) {
    throw_usage("the group size " + std::to_string(size) + " must be a multiple of nnodes " + std::to_string(nnodes));
  }
  if (node_rank < 0 || node_rank >= nnodes) {
    throw_usage("node_rank " + std::to_string(node_rank) + " must be in [0, nnodes " + std::to_string(nnodes) + ")");
  }
  const int per_node = size / nnodes;
  if (local_rank < 0 || local_rank >= per_node) {
    throw_usage("local rank " + std::to_string(local_rank) + " must be in [0, " + std::to_string(per_node) + ") ranks per node");
  }
  if (nnodes > 1 && dist_init_addr.empty()) throw_usage("more than one node needs dist_init_addr (HOST:PORT of node 0)");
  CommSpec spec;
  spec.size = size;
  spec.rank = node_rank * per_node + local_rank;
  spec.device = local_rank;
  spec.dist_init_addr = dist_init_addr;
  return spec;
}

size_t sum_counts(const std::vector<size_t>& counts) { return std::accumulate(counts.begin(), counts.end(), size_t{0}); }

namespace {
template <typename T>
void reduce_typed(T* out, const T* in, size_t count, ReduceOp op) {
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < count; ++i) out[i] += in[i];
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = std::max(out[i], in[i]);
  }
}
}  // namespace

void reduce_into(void* out, const void* in, size_t count, CommDType dtype, ReduceOp op) {
  switch (dtype) {
    case CommDType::kF32: reduce_typed(static_cast<float*>(out), static_cast<const float*>(in), count, op); break;
    case CommDType::kI32: reduce_typed(static_cast<int32_t*>(out), static_cast<const int32_t*>(in), count, op); break;
    case CommDType::kI64: reduce_typed(static_cast<int64_t*>(out), static_cast<const int64_t*>(in), count, op); break;
  }
}

}  // namespace servetune
