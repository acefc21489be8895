// GlooCommunicator: each collective maps to gloo's allreduce / allgatherv / alltoallv / broadcast / barrier with
// the group's timeout. An all-reduce of two ranks or of a small buffer is one all-gather and a local reduction (it is
// latency-bound: one message exchange instead of the ring's two rounds per rank). reduce_scatter is an allreduce of
// the whole buffer followed by taking this rank's slice (gloo's own reduce-scatter is an old-style algorithm class
// without timeouts). Any gloo failure (timeout, peer gone) breaks the communicator: later calls throw at once.
#include "comm/gloo_communicator.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "comm/comm_common.h"
#include "comm/tcp_store.h"
#include "core/error.h"

namespace servetune {
namespace {

// Below this many bytes an all-reduce of more than two ranks gathers every contribution (fewer message rounds).
constexpr size_t kGatherReduceBytes = 64 * 1024;

// Gives gloo's rendezvous a store whose every wait uses our timeout (gloo's get() otherwise waits 30 s).
class TimedStore final : public gloo::rendezvous::Store {
 public:
  TimedStore(std::unique_ptr<gloo::rendezvous::Store> file, std::unique_ptr<TcpStore> tcp, std::chrono::milliseconds timeout)
      : file_(std::move(file)), tcp_(std::move(tcp)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    if (tcp_) tcp_->set(key, data);
    else file_->set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    if (tcp_) return tcp_->get(key);
    file_->wait({key}, timeout_);
    return file_->get(key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    if (tcp_) tcp_->wait(keys, timeout);
    else file_->wait(keys, timeout);
  }

 private:
  std::unique_ptr<gloo::rendezvous::Store> file_;
  std::unique_ptr<TcpStore> tcp_;
  std::chrono::milliseconds timeout_;
};

template <typename T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  return op == ReduceOp::kSum ? Fn(&gloo::sum<T>) : Fn(&gloo::max<T>);
}

gloo::AllreduceOptions::Func reduce_function(CommDType dtype, ReduceOp op) {
  switch (dtype) {
    case CommDType::kF32: return reduce_function<float>(op);
    case CommDType::kI32: return reduce_function<int32_t>(op);
    case CommDType::kI64: return reduce_function<int64_t>(op);
  }
  return {};
}

// Calls f with a null pointer of the element type of `dtype` (gloo's option setters are templates).
template <typename F>
void with_type(CommDType dtype, F&& f) {
  switch (dtype) {
    case CommDType::kF32: f(static_cast<float*>(nullptr)); break;
    case CommDType::kI32: f(static_cast<int32_t*>(nullptr)); break;
    case CommDType::kI64: f(static_cast<int64_t*>(nullptr)); break;
  }
}

// gloo's TCP transport writes without MSG_NOSIGNAL: a peer that has gone would kill this process with SIGPIPE
// instead of failing the collective (Python, gloo's usual host, ignores SIGPIPE). Ignore it unless the program
// installed its own handler.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const CommSpec& spec) : rank_(spec.rank), size_(spec.size), timeout_(spec.timeout) {
    ignore_sigpipe();
    std::unique_ptr<gloo::rendezvous::Store> file;
    std::unique_ptr<TcpStore> tcp;
    if (!spec.dist_init_addr.empty()) {
      const auto [host, port] = parse_host_port(spec.dist_init_addr, "dist_init_addr");
      tcp = std::make_unique<TcpStore>(host, port, spec.rank == 0, spec.timeout);
    } else {
      std::error_code ec;
      std::filesystem::create_directories(spec.file_store_path, ec);
      if (ec) throw_io(spec.file_store_path, "cannot create the gloo file store folder: " + ec.message());
      file = std::make_unique<gloo::rendezvous::FileStore>(spec.file_store_path);
    }
    store_ = std::make_unique<TimedStore>(std::move(file), std::move(tcp), spec.timeout);
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = spec.hostname;
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      context->setTimeout(timeout_);
      context->connectFullMesh(*store_, device_);
      context_ = std::move(context);
    } catch (const Error& e) {
      throw_comm_error(*this, "rendezvous", e.what());
    } catch (const std::exception& e) {
      throw_comm_error(*this, "rendezvous", std::string("gloo: ") + e.what());
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }

  void all_reduce(void* data, size_t count, CommDType dtype, ReduceOp op) override {
    const size_t elem = comm_dtype_size(dtype);
    if (size_ == 2 || count * elem <= kGatherReduceBytes) {
      // One exchange instead of the ring's reduce-scatter + all-gather rounds (the same bytes with two ranks); every
      // rank sums the contributions in rank order, so all get identical results.
      gathered_.resize(count * elem * static_cast<size_t>(size_));
      run("all_reduce", [&] { gatherv(data, gathered_.data(), std::vector<size_t>(static_cast<size_t>(size_), count), dtype); });
      if (count == 0) return;
      std::memcpy(data, gathered_.data(), count * elem);
      for (int r = 1; r < size_; ++r) reduce_into(data, gathered_.data() + static_cast<size_t>(r) * count * elem, count, dtype, op);
      return;
    }
    run("all_reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      set_output(opts, data, count, dtype);
      opts.setReduceFunction(reduce_function(dtype, op));
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  void all_gatherv(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype) override {
    check_counts(*this, "all_gatherv", "counts", counts);
    run("all_gatherv", [&] { gatherv(in, out, counts, dtype); });
  }

  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype, ReduceOp op) override {
    check_counts(*this, "reduce_scatter", "counts", counts);
    const size_t elem = comm_dtype_size(dtype);
    const size_t total = sum_counts(counts);
    scratch_.resize(total * elem);
    if (total > 0) std::memcpy(scratch_.data(), in, total * elem);
    all_reduce(scratch_.data(), total, dtype, op);
    size_t offset = 0;
    for (int r = 0; r < rank_; ++r) offset += counts[static_cast<size_t>(r)];
    const size_t mine = counts[static_cast<size_t>(rank_)];
    if (mine > 0) std::memcpy(out, scratch_.data() + offset * elem, mine * elem);
  }

  void all_to_allv(const void* in, const std::vector<size_t>& send_counts, void* out, const std::vector<size_t>& recv_counts,
                   CommDType dtype) override {
    check_counts(*this, "all_to_allv", "send_counts", send_counts);
    check_counts(*this, "all_to_allv", "recv_counts", recv_counts);
    run("all_to_allv", [&] {
      const size_t elem = comm_dtype_size(dtype);
      const std::vector<int64_t> send(send_counts.begin(), send_counts.end());
      const std::vector<int64_t> recv(recv_counts.begin(), recv_counts.end());
      // gloo wants non-null buffers even when a side is empty.
      char dummy_in = 0, dummy_out = 0;
      void* in_ptr = sum_counts(send_counts) > 0 ? const_cast<void*>(in) : &dummy_in;
      void* out_ptr = sum_counts(recv_counts) > 0 ? out : &dummy_out;
      gloo::AlltoallvOptions opts(context_);
      with_type(dtype, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        opts.setInput<T>(context_->createUnboundBuffer(in_ptr, sum_counts(send_counts) * elem), send);
        opts.setOutput<T>(context_->createUnboundBuffer(out_ptr, sum_counts(recv_counts) * elem), recv);
      });
      opts.setTimeout(timeout_);
      gloo::alltoallv(opts);
    });
  }

  void broadcast(void* data, size_t count, CommDType dtype, int root) override {
    check_root(*this, "broadcast", root);
    run("broadcast", [&] {
      if (count == 0) return;
      gloo::BroadcastOptions opts(context_);
      switch (dtype) {
        case CommDType::kF32: opts.setOutput(static_cast<float*>(data), count); break;
        case CommDType::kI32: opts.setOutput(static_cast<int32_t*>(data), count); break;
        case CommDType::kI64: opts.setOutput(static_cast<int64_t*>(data), count); break;
      }
      opts.setRoot(root);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

  void abort(const std::string& reason) override {
    if (failure_.empty()) failure_ = "rank " + std::to_string(rank_) + " aborted: " + reason;
    // Closing the connections makes peers blocked on this rank fail now rather than at their timeout.
    if (context_) context_->closeConnections();
  }

 private:
  // gloo's all-gatherv (inside run()).
  void gatherv(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype) {
    if (sum_counts(counts) == 0) return;
    gloo::AllgathervOptions opts(context_);
    const size_t elem = comm_dtype_size(dtype);
    // gloo copies this rank's block in from `in`; give it a zero-length pointer inside `out` when there is none.
    char* out_bytes = static_cast<char*>(out);
    size_t my_offset = 0;
    for (int r = 0; r < rank_; ++r) my_offset += counts[static_cast<size_t>(r)];
    const void* my_in = counts[static_cast<size_t>(rank_)] > 0 ? in : out_bytes + my_offset * elem;
    with_type(dtype, [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      opts.setInput<T>(context_->createUnboundBuffer(const_cast<void*>(my_in), counts[static_cast<size_t>(rank_)] * elem));
      opts.setOutput<T>(context_->createUnboundBuffer(out, sum_counts(counts) * elem), counts);
    });
    opts.setTimeout(timeout_);
    gloo::allgatherv(opts);
  }

  static void set_output(gloo::AllreduceOptions& opts, void* data, size_t count, CommDType dtype) {
    switch (dtype) {
      case CommDType::kF32: opts.setOutput(static_cast<float*>(data), count); break;
      case CommDType::kI32: opts.setOutput(static_cast<int32_t*>(data), count); break;
      case CommDType::kI64: opts.setOutput(static_cast<int64_t*>(data), count); break;
    }
  }

  template <typename F>
  void run(const char* op, F&& body) {
    if (!failure_.empty()) throw_comm_error(*this, op, "the communicator has failed: " + failure_);
    try {
      body();
    } catch (const std::exception& e) {
      failure_ = std::string(op) + " failed (a peer failed, left or timed out after " + std::to_string(timeout_.count()) +
                 " ms): gloo: " + e.what();
      if (context_) context_->closeConnections();
      throw_comm_error(*this, op, failure_);
    }
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TimedStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::string failure_;
  std::vector<char> scratch_;
  std::vector<char> gathered_;  // all_reduce's gathered contributions
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const CommSpec& spec) {
  if (spec.dist_init_addr.empty() && spec.file_store_path.empty()) {
    throw_usage("the gloo communicator needs a rendezvous: dist_init_addr (HOST:PORT served by rank 0) or a file store folder");
  }
  return std::make_unique<GlooCommunicator>(spec);
}

}  // namespace servetune
