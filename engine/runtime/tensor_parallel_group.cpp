// Tensor-parallel ranks of a replica in lockstep over a local communicator (see tensor_parallel_group.h).
#include "runtime/tensor_parallel_group.h"

#include <algorithm>

#include "comm/local_communicator.h"
#include "comm/timed_communicator.h"
#include "core/error.h"
#include "model/checkpoint.h"

namespace servetune {

TensorParallelGroup::TensorParallelGroup(const Checkpoint& checkpoint, const std::string& device, int tp_size, int threads_per_rank,
                                         CompileOptions compile)
    : ranks_(static_cast<size_t>(tp_size)) {
  if (tp_size < 1 || threads_per_rank < 1) throw Error(ErrorKind::kInternal, "tensor-parallel group needs ranks and threads");
  std::shared_ptr<LocalGroup> group = tp_size > 1 ? LocalGroup::create(tp_size) : nullptr;
  for (int r = 0; r < tp_size; ++r) {
    Rank& rank = ranks_[static_cast<size_t>(r)];
    rank.backend = make_backend(device, threads_per_rank);
    if (group) {
      rank.comm_owner = std::make_unique<TimedCommunicator>(group->communicator(r));
      rank.comm = rank.comm_owner.get();
    }
    rank.model = checkpoint.load(*rank.backend, ParallelContext{r, tp_size, rank.comm}, compile);
  }
}

TensorParallelGroup::~TensorParallelGroup() { stop_workers(); }

int64_t TensorParallelGroup::kv_block_bytes(int64_t page_size, DType dtype) const {
  int64_t bytes = 0;
  for (const Rank& rank : ranks_) bytes += KvStorage::block_bytes(rank.model->config(), rank.model->local_kv_heads(), page_size, dtype);
  return bytes;
}

void TensorParallelGroup::create_kv(int64_t num_blocks, int64_t page_size, DType dtype) {
  for (Rank& rank : ranks_) {
    rank.kv = std::make_unique<KvStorage>(*rank.backend, rank.model->config(), rank.model->local_kv_heads(), num_blocks, page_size, dtype);
  }
  for (int r = 1; r < size(); ++r) ranks_[static_cast<size_t>(r)].thread = std::thread([this, r] { worker(r); });
}

void TensorParallelGroup::forward(const Batch& batch, std::vector<float>& logits) {
  Rank& self = ranks_[0];
  if (size() == 1) {
    self.model->forward(batch, *self.kv, logits);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch_ = &batch;
    pending_ = size() - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr own_error;
  try {
    self.model->forward(batch, *self.kv, logits);
  } catch (const std::exception& ex) {
    own_error = std::current_exception();
    self.comm->abort(std::string("rank 0 failed: ") + ex.what());  // releases workers blocked in a collective
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  batch_ = nullptr;
  if (own_error) std::rethrow_exception(own_error);
  if (worker_error_) std::rethrow_exception(worker_error_);
  account_collectives();
}

void TensorParallelGroup::account_collectives() {
  std::vector<std::vector<TimedCommunicator::Interval>> per_rank;
  for (Rank& rank : ranks_) per_rank.push_back(rank.comm->take_intervals());
  const size_t n = per_rank[0].size();
  for (const auto& intervals : per_rank) {
    if (intervals.size() != n) throw Error(ErrorKind::kInternal, "tensor-parallel ranks ran different numbers of collectives");
  }
  int64_t shortest_ns = 0, rank0_ns = 0;
  for (size_t i = 0; i < n; ++i) {
    int64_t shortest = per_rank[0][i].end_ns - per_rank[0][i].start_ns;
    rank0_ns += shortest;
    for (const auto& intervals : per_rank) shortest = std::min(shortest, intervals[i].end_ns - intervals[i].start_ns);
    shortest_ns += shortest;
  }
  comm_seconds_ += static_cast<double>(shortest_ns) * 1e-9;
  comm_wait_seconds_ += static_cast<double>(rank0_ns - shortest_ns) * 1e-9;
}

void TensorParallelGroup::worker(int r) {
  Rank& self = ranks_[static_cast<size_t>(r)];
  uint64_t seen = 0;
  for (;;) {
    const Batch* batch = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      batch = batch_;
    }
    try {
      self.model->forward(*batch, *self.kv, self.logits);
    } catch (const std::exception& ex) {
      self.comm->abort("rank " + std::to_string(r) + " failed: " + ex.what());
      std::lock_guard<std::mutex> lock(mu_);
      if (!worker_error_) worker_error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    done_cv_.notify_all();
  }
}

void TensorParallelGroup::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (Rank& rank : ranks_) {
    if (rank.thread.joinable()) rank.thread.join();
  }
}

}  // namespace servetune
