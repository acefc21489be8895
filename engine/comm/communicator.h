// Communicator: collectives over a fixed group of ranks (local threads, gloo processes, NCCL GPUs) behind one
// interface. Every rank calls the same collectives in the same order with matching sizes; buffers live where the
// backend computes (host memory for local and gloo, device memory for nccl). A rank that fails, aborts or never
// arrives makes the others throw Error within the group's timeout instead of hanging; after that error the group
// is broken and every later call throws at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace servetune {

enum class CommDType { kF32, kI32, kI64 };
enum class ReduceOp { kSum, kMax };

size_t comm_dtype_size(CommDType dtype);
const char* comm_dtype_name(CommDType dtype);
const char* reduce_op_name(ReduceOp op);

template <typename T> constexpr CommDType comm_dtype_of();
template <> constexpr CommDType comm_dtype_of<float>() { return CommDType::kF32; }
template <> constexpr CommDType comm_dtype_of<int32_t>() { return CommDType::kI32; }
template <> constexpr CommDType comm_dtype_of<int64_t>() { return CommDType::kI64; }

constexpr std::chrono::milliseconds kDefaultCommTimeout{std::chrono::minutes(5)};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "local" | "gloo" | "nccl"

  // Element-wise reduction of `count` elements across ranks, in place on every rank.
  virtual void all_reduce(void* data, size_t count, CommDType dtype, ReduceOp op) = 0;
  // Rank r contributes counts[r] elements from `in`; every rank receives all of them, in rank order, in `out`
  // (sum(counts) elements). Counts may differ between ranks (all_gatherv) and may be zero.
  virtual void all_gatherv(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype) = 0;
  // `in` holds sum(counts) elements on every rank; the element-wise reduction is computed and rank r receives
  // its slice (counts[r] elements, at offset sum(counts[0..r))) in `out`.
  virtual void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype, ReduceOp op) = 0;
  // Rank r sends send_counts[p] elements to rank p (consecutive in `in`, in rank order) and receives
  // recv_counts[p] elements from rank p (consecutive in `out`, in rank order). recv_counts[p] on rank r must equal
  // send_counts[r] on rank p.
  virtual void all_to_allv(const void* in, const std::vector<size_t>& send_counts, void* out,
                           const std::vector<size_t>& recv_counts, CommDType dtype) = 0;
  // Copies `count` elements from rank `root` to every rank, in place.
  virtual void broadcast(void* data, size_t count, CommDType dtype, int root) = 0;
  virtual void barrier() = 0;
  // Marks this rank failed: peers blocked in (or later entering) a collective throw Error naming this rank and
  // `reason`; this communicator throws on every later call. Idempotent.
  virtual void abort(const std::string& reason) = 0;

  // Typed conveniences over the calls above.
  template <typename T> void all_reduce(T* data, size_t count, ReduceOp op) { all_reduce(data, count, comm_dtype_of<T>(), op); }
  template <typename T> void all_gatherv(const T* in, T* out, const std::vector<size_t>& counts) {
    all_gatherv(in, out, counts, comm_dtype_of<T>());
  }
  // Equal sizes: `count` elements per rank, size() * count in `out`.
  template <typename T> void all_gather(const T* in, T* out, size_t count) {
    all_gatherv(in, out, std::vector<size_t>(static_cast<size_t>(size()), count), comm_dtype_of<T>());
  }
  template <typename T> void reduce_scatter(const T* in, T* out, const std::vector<size_t>& counts, ReduceOp op) {
    reduce_scatter(in, out, counts, comm_dtype_of<T>(), op);
  }
  template <typename T> void all_to_allv(const T* in, const std::vector<size_t>& send_counts, T* out,
                                         const std::vector<size_t>& recv_counts) {
    all_to_allv(in, send_counts, out, recv_counts, comm_dtype_of<T>());
  }
  // Equal sizes: `count` elements to and from every rank.
  template <typename T> void all_to_all(const T* in, T* out, size_t count) {
    const std::vector<size_t> counts(static_cast<size_t>(size()), count);
    all_to_allv(in, counts, out, counts, comm_dtype_of<T>());
  }
  template <typename T> void broadcast(T* data, size_t count, int root) { broadcast(data, count, comm_dtype_of<T>(), root); }
};

class LocalGroup;

// How a rank finds its group. Which fields apply depends on the backend:
//   local: local_group (shared by the threads of one process);
//   gloo:  file_store_path (a folder every rank can reach, e.g. on a shared file system) or dist_init_addr
//          (host:port where rank 0 serves a TCP store); hostname is this rank's address for peers;
//   nccl:  dist_init_addr (rank 0 publishes the NCCL unique id there); device is the local GPU index.
struct CommSpec {
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
  std::shared_ptr<LocalGroup> local_group;
  std::string file_store_path;
  std::string dist_init_addr;
  std::string hostname = "127.0.0.1";
  int device = 0;
};

// SGLang's multi-node layout (--nnodes, --node-rank, --dist-init-addr): `size` ranks spread evenly over `nnodes`
// nodes; this process is local rank `local_rank` of node `node_rank`. Returns a spec with the global rank
// node_rank * (size / nnodes) + local_rank and device local_rank. Throws Error(kUsage) for a layout that does not fit.
CommSpec node_rank_spec(int size, int nnodes, int node_rank, int local_rank, const std::string& dist_init_addr);

// The names make_communicator accepts in this build ("local", "gloo", and "nccl" when built with NCCL).
std::vector<std::string> communicator_backends();
// Creates this rank's communicator. Throws Error(kUsage) for an unknown backend or a spec that does not fit it,
// Error(kUnsupported) for nccl in a build without it.
std::unique_ptr<Communicator> make_communicator(const std::string& backend, const CommSpec& spec);

}  // namespace servetune
