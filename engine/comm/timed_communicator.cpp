// The duration of every collective (see timed_communicator.h).
#include "comm/timed_communicator.h"

#include <chrono>

namespace servetune {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

template <class F>
void TimedCommunicator::timed(F&& call) {
  const int64_t start = now_ns();
  call();  // a throwing collective breaks the group; its duration does not matter
  durations_ns_.push_back(now_ns() - start);
}

void TimedCommunicator::all_reduce(void* data, size_t count, CommDType dtype, ReduceOp op) {
  timed([&] { inner_->all_reduce(data, count, dtype, op); });
}

void TimedCommunicator::all_gatherv(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype) {
  timed([&] { inner_->all_gatherv(in, out, counts, dtype); });
}

void TimedCommunicator::reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype, ReduceOp op) {
  timed([&] { inner_->reduce_scatter(in, out, counts, dtype, op); });
}

void TimedCommunicator::all_to_allv(const void* in, const std::vector<size_t>& send_counts, void* out,
                                    const std::vector<size_t>& recv_counts, CommDType dtype) {
  timed([&] { inner_->all_to_allv(in, send_counts, out, recv_counts, dtype); });
}

void TimedCommunicator::broadcast(void* data, size_t count, CommDType dtype, int root) {
  timed([&] { inner_->broadcast(data, count, dtype, root); });
}

void TimedCommunicator::barrier() {
  timed([&] { inner_->barrier(); });
}

}  // namespace servetune
