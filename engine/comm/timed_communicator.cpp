// The kind, payload and duration of every collective (see timed_communicator.h).
#include "comm/timed_communicator.h"

#include <chrono>
#include <numeric>

namespace servetune {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

size_t total(const std::vector<size_t>& counts) { return std::accumulate(counts.begin(), counts.end(), size_t{0}); }

}  // namespace

std::vector<int64_t> TimedCommunicator::take_durations() {
  std::vector<int64_t> ns;
  ns.reserve(records_.size());
  for (const CollectiveRecord& r : records_) ns.push_back(r.ns);
  records_.clear();
  return ns;
}

template <class F>
void TimedCommunicator::timed(CollectiveKind kind, size_t elements, CommDType dtype, F&& call) {
  const int64_t start = now_ns();
  call();  // a throwing collective breaks the group; its record does not matter
  records_.push_back({kind, static_cast<int64_t>(elements * comm_dtype_size(dtype)), now_ns() - start});
}

void TimedCommunicator::all_reduce(void* data, size_t count, CommDType dtype, ReduceOp op) {
  timed(CollectiveKind::kAllReduce, count, dtype, [&] { inner_->all_reduce(data, count, dtype, op); });
}

void TimedCommunicator::all_gatherv(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype) {
  timed(CollectiveKind::kAllGather, total(counts), dtype, [&] { inner_->all_gatherv(in, out, counts, dtype); });
}

void TimedCommunicator::reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype, ReduceOp op) {
  timed(CollectiveKind::kReduceScatter, total(counts), dtype, [&] { inner_->reduce_scatter(in, out, counts, dtype, op); });
}

void TimedCommunicator::all_to_allv(const void* in, const std::vector<size_t>& send_counts, void* out,
                                    const std::vector<size_t>& recv_counts, CommDType dtype) {
  timed(CollectiveKind::kAllToAll, total(send_counts), dtype, [&] { inner_->all_to_allv(in, send_counts, out, recv_counts, dtype); });
}

void TimedCommunicator::broadcast(void* data, size_t count, CommDType dtype, int root) {
  timed(CollectiveKind::kBroadcast, count, dtype, [&] { inner_->broadcast(data, count, dtype, root); });
}

void TimedCommunicator::barrier() {
  timed(CollectiveKind::kBarrier, 0, CommDType::kF32, [&] { inner_->barrier(); });
}

}  // namespace servetune
