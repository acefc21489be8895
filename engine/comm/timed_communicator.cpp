// Wall-time accounting around every collective (see timed_communicator.h).
#include "comm/timed_communicator.h"

#include <chrono>

namespace servetune {

template <class F>
void TimedCommunicator::timed(F&& call) {
  const auto start = std::chrono::steady_clock::now();
  struct AddElapsed {
    std::atomic<int64_t>& total;
    std::chrono::steady_clock::time_point start;
    ~AddElapsed() {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      total.fetch_add(ns, std::memory_order_relaxed);
    }
  } add{nanos_, start};
  call();
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
