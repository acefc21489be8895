// NcclCommunicator: every call enqueues NCCL work on the communicator's stream and polls it to completion
// (cudaStreamQuery + ncclCommGetAsyncError) until the timeout, then aborts. Uneven all_gatherv / reduce_scatter
// are grouped broadcasts / reduces; all_to_allv is grouped send/recv; barrier is a one-element all_reduce.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "comm/comm_common.h"
#include "comm/tcp_store.h"
#include "core/error.h"

namespace servetune {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(CommDType dtype) {
  switch (dtype) {
    case CommDType::kF32: return ncclFloat32;
    case CommDType::kI32: return ncclInt32;
    case CommDType::kI64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const CommSpec& spec) : rank_(spec.rank), size_(spec.size), timeout_(spec.timeout) {
    if (spec.dist_init_addr.empty()) throw_usage("the nccl communicator needs dist_init_addr (HOST:PORT where rank 0 publishes the NCCL id)");
    const auto [host, port] = parse_host_port(spec.dist_init_addr, "dist_init_addr");
    cuda_check(cudaSetDevice(spec.device), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaMalloc(&barrier_buffer_, sizeof(int32_t)), "cudaMalloc");
    // The store stays alive with the communicator: rank 0 serves it until every rank has read the id.
    store_ = std::make_unique<TcpStore>(host, port, rank_ == 0, timeout_);
    ncclUniqueId id{};
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store_->set("nccl_unique_id", std::vector<char>(id.internal, id.internal + sizeof id.internal));
    } else {
      const auto bytes = store_->get("nccl_unique_id");
      if (bytes.size() != sizeof id.internal) throw_comm_error(*this, "bootstrap", "malformed NCCL unique id from rank 0");
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) nccl_check(rc, "ncclCommInitRankConfig");
    wait_comm_ready("bootstrap");
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      if (failure_.empty()) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_reduce(void* data, size_t count, CommDType dtype, ReduceOp op) override {
    run("all_reduce", [&] { return ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), comm_, stream_); });
  }

  void all_gatherv(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype) override {
    check_counts(*this, "all_gatherv", "counts", counts);
    const bool even = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    const size_t elem = comm_dtype_size(dtype);
    run("all_gatherv", [&] {
      if (even) return ncclAllGather(in, out, counts[0], nccl_type(dtype), comm_, stream_);
      ncclResult_t rc = ncclGroupStart();
      size_t offset = 0;
      for (int r = 0; r < size_ && ok(rc); ++r) {
        rc = ncclBroadcast(in, static_cast<char*>(out) + offset * elem, counts[static_cast<size_t>(r)], nccl_type(dtype), r, comm_, stream_);
        offset += counts[static_cast<size_t>(r)];
      }
      const ncclResult_t end = ncclGroupEnd();
      return ok(rc) ? end : rc;
    });
  }

  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype, ReduceOp op) override {
    check_counts(*this, "reduce_scatter", "counts", counts);
    const bool even = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    const size_t elem = comm_dtype_size(dtype);
    run("reduce_scatter", [&] {
      if (even) return ncclReduceScatter(in, out, counts[0], nccl_type(dtype), nccl_op(op), comm_, stream_);
      ncclResult_t rc = ncclGroupStart();
      size_t offset = 0;
      for (int r = 0; r < size_ && ok(rc); ++r) {
        rc = ncclReduce(static_cast<const char*>(in) + offset * elem, r == rank_ ? out : nullptr, counts[static_cast<size_t>(r)],
                        nccl_type(dtype), nccl_op(op), r, comm_, stream_);
        offset += counts[static_cast<size_t>(r)];
      }
      const ncclResult_t end = ncclGroupEnd();
      return ok(rc) ? end : rc;
    });
  }

  void all_to_allv(const void* in, const std::vector<size_t>& send_counts, void* out, const std::vector<size_t>& recv_counts,
                   CommDType dtype) override {
    check_counts(*this, "all_to_allv", "send_counts", send_counts);
    check_counts(*this, "all_to_allv", "recv_counts", recv_counts);
    const size_t elem = comm_dtype_size(dtype);
    run("all_to_allv", [&] {
      ncclResult_t rc = ncclGroupStart();
      size_t send_offset = 0, recv_offset = 0;
      for (int p = 0; p < size_ && ok(rc); ++p) {
        const auto up = static_cast<size_t>(p);
        if (send_counts[up] > 0) {
          rc = ncclSend(static_cast<const char*>(in) + send_offset * elem, send_counts[up], nccl_type(dtype), p, comm_, stream_);
        }
        if (ok(rc) && recv_counts[up] > 0) {
          rc = ncclRecv(static_cast<char*>(out) + recv_offset * elem, recv_counts[up], nccl_type(dtype), p, comm_, stream_);
        }
        send_offset += send_counts[up];
        recv_offset += recv_counts[up];
      }
      const ncclResult_t end = ncclGroupEnd();
      return ok(rc) ? end : rc;
    });
  }

  void broadcast(void* data, size_t count, CommDType dtype, int root) override {
    check_root(*this, "broadcast", root);
    run("broadcast", [&] { return ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream_); });
  }

  void barrier() override {
    run("barrier", [&] { return ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclInt32, ncclSum, comm_, stream_); });
  }

  void abort(const std::string& reason) override {
    if (failure_.empty()) failure_ = "rank " + std::to_string(rank_) + " aborted: " + reason;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  static bool ok(ncclResult_t rc) { return rc == ncclSuccess || rc == ncclInProgress; }

  void cuda_check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) throw_comm_error(*this, what, cudaGetErrorString(rc));
  }
  void nccl_check(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess) throw_comm_error(*this, what, ncclGetErrorString(rc));
  }

  void fail(const char* op, const std::string& what) {
    failure_ = std::string(op) + ": " + what;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw_comm_error(*this, op, what);
  }

  // Polls until the communicator has no operation in progress, or aborts it after the timeout.
  void wait_comm_ready(const char* op) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(op, std::string("nccl: ") + ncclGetErrorString(state));
      if (Clock::now() >= deadline) fail(op, "timed out after " + std::to_string(timeout_.count()) + " ms (a peer is missing or failed)");
      std::this_thread::yield();
    }
  }

  template <typename F>
  void run(const char* op, F&& enqueue) {
    if (!failure_.empty()) throw_comm_error(*this, op, "the communicator has failed: " + failure_);
    const ncclResult_t rc = enqueue();
    if (!ok(rc)) fail(op, std::string("nccl: ") + ncclGetErrorString(rc));
    wait_comm_ready(op);
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) fail(op, std::string("cuda: ") + cudaGetErrorString(q));
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) fail(op, std::string("nccl: ") + ncclGetErrorString(state));
      if (Clock::now() >= deadline) fail(op, "timed out after " + std::to_string(timeout_.count()) + " ms (a peer is missing or failed)");
      std::this_thread::yield();
    }
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStore> store_;
  cudaStream_t stream_ = nullptr;
  void* barrier_buffer_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::string failure_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const CommSpec& spec) { return std::make_unique<NcclCommunicator>(spec); }

}  // namespace servetune
