// Tensor-parallel ranks of a replica in lockstep: threads over a local communicator, or rank 0 of worker processes
// (see tensor_parallel_group.h).
#include "runtime/tensor_parallel_group.h"

#include <algorithm>
#include <utility>

#include "comm/local_communicator.h"
#include "comm/timed_communicator.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "servetune/engine_config.h"
#include "runtime/step_channel.h"

namespace servetune {

// graphs is fused plus decode graphs up to cuda_graph_max_bs (SGLang's default, 160, when it is 0), never more
// than the running-request limit.
CompileOptions compile_options(const EngineConfig& c) {
  CompileOptions o;
  o.fused = c.compile != CompileLevel::kEager;
  if (c.compile == CompileLevel::kGraphs) {
    o.graph_max_bs = std::min<int64_t>(c.cuda_graph_max_bs > 0 ? c.cuda_graph_max_bs : 160, c.max_running_requests);
  }
  return o;
}

ExpertSplit expert_split(const EngineConfig& c) {
  ExpertSplit s(c.ep_size);
  s.redundant_experts = c.ep_num_redundant_experts;
  s.expert_location = c.init_expert_location;
  return s;
}

TensorParallelGroup::TensorParallelGroup(const Checkpoint& checkpoint, const std::string& device, int tp_size, int threads_per_rank,
                                         CompileOptions compile, std::chrono::milliseconds timeout, ExpertSplit experts,
                                         std::unique_ptr<Communicator> replicas, bool moe_all_to_all,
                                         std::unique_ptr<Communicator> sync)
    : ranks_(static_cast<size_t>(tp_size)), tp_size_(tp_size) {
  if (tp_size < 1 || threads_per_rank < 1) throw Error(ErrorKind::kInternal, "tensor-parallel group needs ranks and threads");
  if (replicas && tp_size != 1) throw Error(ErrorKind::kInternal, "a DP-attention replica has one rank");
  if (sync && !replicas) throw Error(ErrorKind::kInternal, "a replicas' lockstep without DP attention");
  if (replicas) {
    replicas_ = std::make_unique<TimedCommunicator>(std::move(replicas));
    sync_owner_ = std::move(sync);
    sync_ = sync_owner_ ? sync_owner_.get() : replicas_.get();
  }
  std::shared_ptr<LocalGroup> group = tp_size > 1 ? LocalGroup::create(tp_size, timeout) : nullptr;
  for (int r = 0; r < tp_size; ++r) {
    Rank& rank = ranks_[static_cast<size_t>(r)];
    rank.backend = make_backend(device, threads_per_rank);
    if (group) {
      rank.comm_owner = std::make_unique<TimedCommunicator>(group->communicator(r));
      rank.comm = rank.comm_owner.get();
    }
    rank.model = checkpoint.load(*rank.backend,
                                 ParallelContext{r, tp_size, rank.comm, 1, replicas_.get(), moe_all_to_all}.with_experts(experts),
                                 compile);
  }
  config_ = ranks_[0].model->config();
}

TensorParallelGroup::TensorParallelGroup(const Checkpoint& checkpoint, const std::string& device, std::unique_ptr<Communicator> channel,
                                         std::unique_ptr<Communicator> sync, std::chrono::milliseconds timeout,
                                         const ExpertSplit& experts, bool moe_all_to_all)
    : ranks_(1), config_(checkpoint.config()), sync_owner_(std::move(sync)), remote_replica_(true) {
  if (channel->rank() != 0 || channel->size() != 2 || !sync_owner_) {
    throw Error(ErrorKind::kInternal, "a remote DP-attention replica is rank 0 of its two-rank channel, with a lockstep group");
  }
  timeout_ = timeout;
  sync_ = sync_owner_.get();
  ranks_[0].backend = make_backend(device, 1);
  remote_fingerprint_ = model_fingerprint(config_, 1, experts, sync_->size(), moe_all_to_all);
  Communicator& raw = *channel;
  ranks_[0].comm_owner = std::make_unique<TimedCommunicator>(std::move(channel));
  ranks_[0].comm = ranks_[0].comm_owner.get();
  channel_ = std::make_unique<StepChannel>(raw);
}

TensorParallelGroup::TensorParallelGroup(const Checkpoint& checkpoint, const std::string& device, int threads,
                                         std::unique_ptr<Communicator> comm, std::chrono::milliseconds timeout,
                                         CompileOptions compile, ExpertSplit experts)
    : ranks_(1), tp_size_(comm->size()), timeout_(timeout) {
  if (comm->rank() != 0 || threads < 1) throw Error(ErrorKind::kInternal, "a tensor-parallel group of processes is led by rank 0");
  Rank& rank = ranks_[0];
  rank.backend = make_backend(device, threads);
  Communicator& raw = *comm;
  rank.comm_owner = std::make_unique<TimedCommunicator>(std::move(comm));
  rank.comm = rank.comm_owner.get();
  channel_ = std::make_unique<StepChannel>(raw);
  rank.model = checkpoint.load(*rank.backend,
                               ParallelContext{0, tp_size_, rank.comm}.with_experts(experts), compile);
  config_ = rank.model->config();
}

TensorParallelGroup::~TensorParallelGroup() {
  stop_workers();
  stop_remote();
}

int64_t TensorParallelGroup::kv_block_bytes(int64_t page_size, DType dtype) const {
  int64_t bytes = 0;
  for (int r = 0; r < tp_size_; ++r) {
    bytes += KvStorage::block_bytes(config_, tensor_parallel_share(config_, tp_size_, r).kv_heads.count, page_size, dtype);
  }
  return bytes;
}

ExpertLoad TensorParallelGroup::expert_load() const { return remote_replica_ ? remote_load_ : ranks_[0].model->expert_load(); }

std::vector<std::vector<int64_t>> TensorParallelGroup::expert_distribution() const {
  return remote_replica_ ? std::vector<std::vector<int64_t>>{} : ranks_[0].model->expert_distribution();
}

void TensorParallelGroup::create_kv(int64_t num_blocks, int64_t page_size, DType dtype) {
  kv_layout_ = KvLayout{num_blocks, page_size, dtype};
  for (Rank& rank : ranks_) {
    if (!rank.model) continue;  // a remote replica's cache is in its worker
    rank.kv = std::make_unique<KvStorage>(*rank.backend, rank.model->config(), rank.model->local_kv_heads(), num_blocks, page_size, dtype);
  }
  for (int r = 1; r < size(); ++r) ranks_[static_cast<size_t>(r)].thread = std::thread([this, r] { worker(r); });
  if (channel_) {
    channel_->send_handshake(kv_layout_, remote_replica_ ? remote_fingerprint_ : model_fingerprint(config_, ranks_[0].model->parallel()));
  }
}

void TensorParallelGroup::forward(const Batch& batch, std::vector<float>& logits) {
  Rank& self = ranks_[0];
  if (remote_replica_) {
    forward_remote_replica(batch, logits);
    return;
  }
  if (channel_) {
    forward_remote(batch, logits);
    return;
  }
  if (size() == 1) {
    forward_own(batch, logits);
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

// One rank in this process and no workers: the model alone, or a DP-attention replica, whose failure must reach the
// other replicas waiting in its MoE layers' collectives.
void TensorParallelGroup::forward_own(const Batch& batch, std::vector<float>& logits) {
  Rank& self = ranks_[0];
  if (!replicas_) {
    self.model->forward(batch, *self.kv, logits);
    return;
  }
  try {
    self.model->forward(batch, *self.kv, logits);
  } catch (const std::exception& ex) {
    replicas_->abort(std::string("replica ") + std::to_string(replicas_->rank()) + " failed: " + ex.what());
    throw;
  }
  // Replica 0's collectives (it joins every step, as rank 0 does under tensor parallelism; the front sums the
  // replicas): its own time in the gathers and scatters, its wait for slower replicas included (not told apart here).
  const std::vector<CollectiveRecord> records = replicas_->take_records();
  if (replicas_->rank() == 0) account(records, {});
}

ReplicaSync TensorParallelGroup::sync_replicas(bool has_batch, bool stopping) {
  int32_t flags[2] = {has_batch ? 1 : 0, stopping ? 1 : 0};
  sync_->all_reduce(flags, 2, ReduceOp::kMax);
  if (sync_ == replicas_.get()) replicas_->take_records();  // the lockstep's own handshake, not the model's communication
  return ReplicaSync{flags[0] != 0, flags[1] != 0};
}

void TensorParallelGroup::forward_idle() {
  const Batch empty;
  std::vector<float> logits;
  if (remote_replica_) forward_remote_replica(empty, logits);
  else forward_own(empty, logits);
}

// The step runs in the replica's worker process, its MoE layers with every other replica's; its logits come back.
// The channel's time is the worker's whole step, not communication of the model, so it is not accounted.
std::span<const float> TensorParallelGroup::hidden_rows() const {
  if (remote_replica_) return remote_hidden_;
  return ranks_[0].model->hidden_rows();
}

// A remote replica's worker runs the MoE decoder, which keeps them.
bool TensorParallelGroup::supports_hidden() const { return remote_replica_ || ranks_[0].model->supports_hidden(); }

void TensorParallelGroup::forward_remote_replica(const Batch& batch, std::vector<float>& logits) {
  channel_->send_step(batch, 0);
  const size_t hidden = batch.return_hidden ? static_cast<size_t>(batch.n_tokens() * config_.hidden) : 0;
  channel_->receive_reply(batch.logits_indices.size(), static_cast<size_t>(config_.vocab), logits, remote_load_, hidden,
                          remote_hidden_);
}

void TensorParallelGroup::forward_remote(const Batch& batch, std::vector<float>& logits) {
  Rank& self = ranks_[0];
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::vector<int64_t>> durations = channel_->send_step(batch, previous_.size());
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  account(std::exchange(previous_, {}), durations);
  try {
    self.model->forward(batch, *self.kv, logits);
  } catch (const std::exception& ex) {
    self.comm->abort(std::string("rank 0 failed: ") + ex.what());  // closes the connections: the workers fail too
    throw;
  }
  previous_ = self.comm->take_records();
}

void TensorParallelGroup::move_kv(const KvMove& move) {
  if (move.from.empty()) return;
  if (channel_) {
    // A remote replica's worker reports no collectives (its channel is no collective of the model).
    const auto durations = channel_->send_move_kv(move, remote_replica_ ? 0 : previous_.size());
    if (!remote_replica_) account(std::exchange(previous_, {}), durations);
  }
  if (remote_replica_) return;  // the cache is the worker's
  for (int r = 0; r < size(); ++r) kv(r).copy_slots(backend(r), move.from, move.to);
}

std::chrono::milliseconds TensorParallelGroup::keep_alive_interval() const {
  return channel_ ? std::max(std::chrono::milliseconds(50), timeout_ / 4) : std::chrono::milliseconds(0);
}

void TensorParallelGroup::keep_alive() {
  if (!channel_) return;
  const auto durations = channel_->send(RankMessage::kKeepAlive, previous_.size());
  account(std::exchange(previous_, {}), durations);
}

void TensorParallelGroup::stop_remote() {
  if (!channel_) return;
  try {
    channel_->send(RankMessage::kShutdown, previous_.size());
  } catch (const std::exception&) {
    // The group failed earlier (that error went to the step that saw it); the workers have stopped already.
  }
}

void TensorParallelGroup::account_collectives() {
  std::vector<std::vector<int64_t>> others;
  for (size_t r = 1; r < ranks_.size(); ++r) others.push_back(ranks_[r].comm->take_durations());
  account(ranks_[0].comm->take_records(), others);
}

void TensorParallelGroup::account(const std::vector<CollectiveRecord>& own, const std::vector<std::vector<int64_t>>& others) {
  const size_t n = own.size();
  for (const auto& d : others) {
    if (d.size() != n) throw Error(ErrorKind::kInternal, "tensor-parallel ranks ran different numbers of collectives");
  }
  int64_t shortest_ns = 0, rank0_ns = 0;
  for (size_t i = 0; i < n; ++i) {
    int64_t shortest = own[i].ns;
    rank0_ns += shortest;
    for (const auto& d : others) shortest = std::min(shortest, d[i]);
    shortest_ns += shortest;
    CollectiveTotals& kind = totals_of(collectives_, own[i].kind);
    ++kind.calls;
    kind.bytes += own[i].bytes;
    kind.seconds += static_cast<double>(shortest) * 1e-9;
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
