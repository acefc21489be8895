// A Communicator decorator that records how long each collective took on this rank (waiting for peers included), so
// an engine can tell the cost of its communication path from time spent waiting for slower ranks.
// Not synchronised: the owner reads the durations between collectives (e.g. after a step all ranks finished).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace servetune {

class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  // The durations (ns) of the collectives since the last call, in call order; clears them.
  std::vector<int64_t> take_durations() { return std::exchange(durations_ns_, {}); }

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
  std::vector<int64_t> durations_ns_;
};

}  // namespace servetune
