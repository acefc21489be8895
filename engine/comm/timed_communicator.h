// A Communicator decorator that adds up the wall time spent inside collectives (waiting for peers included), so an
// engine can report how much of a step its communication path costs. The total is readable from any thread.
#pragma once

#include <atomic>
#include <memory>

#include "comm/communicator.h"

namespace servetune {

class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  double seconds() const { return nanos_.load(std::memory_order_relaxed) * 1e-9; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  void all_reduce(void* data, size_t count, CommDType dtype, ReduceOp op) override;
  void all_gatherv(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype) override;
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype, ReduceOp op) override;
  void all_to_allv(const void* in, const std::vector<size_t>& send_counts, void* out, const std::vector<size_t>& recv_counts,
                   CommDType dtype) override;
  void broadcast(void* data, size_t count, CommDType dtype, int root) override;
  void barrier() override;
  void abort(const std::string& reason) override { inner_->abort(reason); }

  using Communicator::all_gatherv;
  using Communicator::all_reduce;
  using Communicator::all_to_allv;
  using Communicator::broadcast;
  using Communicator::reduce_scatter;

 private:
  template <class F> void timed(F&& call);

  std::unique_ptr<Communicator> inner_;
  std::atomic<int64_t> nanos_{0};
};

}  // namespace servetune
