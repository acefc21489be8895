// A Communicator decorator that records each collective this rank ran: its kind, its payload bytes on this rank (see
// CollectiveTotals) and how long it took (waiting for peers included), so an engine can tell the cost of its
// communication path from time spent waiting for slower ranks, per kind of collective.
// Not synchronised: the owner reads the records between collectives (e.g. after a step all ranks finished).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "servetune/collective_kind.h"

namespace servetune {

struct CollectiveRecord {
  CollectiveKind kind = CollectiveKind::kBarrier;
  int64_t bytes = 0;
  int64_t ns = 0;
};

class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  // The collectives since the last take, in call order; clears them.
  std::vector<CollectiveRecord> take_records() { return std::exchange(records_, {}); }
  // Their durations (ns) alone (what a worker process reports to rank 0, which knows the kinds and sizes: every rank
  // runs the same collectives in the same order).
  std::vector<int64_t> take_durations();

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
  template <class F> void timed(CollectiveKind kind, size_t elements, CommDType dtype, F&& call);

  std::unique_ptr<Communicator> inner_;
  std::vector<CollectiveRecord> records_;
};

}  // namespace servetune
