// The `local` backend: collectives are rendezvous of the group's threads. all_reduce and all_gatherv stage each
// rank's input and need one; the others take two: after the first, each rank reads its peers' published buffers and
// computes its result into scratch memory; after the second (nobody reads any more) it writes the result to its
// output. Either way in-place and overlapping buffers are safe. A waiting rank spins
// briefly (yielding its core) before it sleeps, since a futex wake-up costs more than most collectives here.
#include "comm/local_communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/comm_common.h"
#include "core/error.h"

namespace servetune {

// What one rank published for the current collective.
struct Posted {
  std::string signature;  // op, dtype, sizes: must match across ranks
  const void* in = nullptr;
  // all_to_allv's counts, copied: a rank that fails the collective may leave (and free its own) while peers check.
  std::vector<size_t> send_counts;
  std::vector<size_t> recv_counts;
};

struct LocalGroup::State {
  int size = 0;
  std::chrono::milliseconds timeout{};
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t generation = 0;   // completed rendezvous
  std::atomic<uint64_t> published_generation{0};  // generation, readable without the mutex (spinning waiters)
  std::atomic<bool> published_failed{false};
  std::chrono::nanoseconds spin{0};  // how long a waiting rank spins before sleeping
  int arrived = 0;           // ranks waiting in the current one
  std::vector<uint64_t> arrivals;  // per rank: rendezvous entered
  std::vector<Posted> posted[2];  // by rendezvous parity: a rank can be at most one rendezvous ahead of another
  // Per rank, by rendezvous parity: staged inputs (all_reduce, all_gatherv), here so they outlive a rank that
  // leaves right after its last collective while peers still read them. Only the owning rank writes its own.
  std::vector<std::vector<char>> staging[2];
  std::vector<bool> taken;
  bool failed = false;
  std::string failure;
};

namespace {

// Spins until `done()` holds or `budget` passes (yielding the core after the first microseconds); true when it held.
template <class Pred>
bool spin_until(Pred done, std::chrono::nanoseconds budget) {
  if (budget.count() <= 0) return false;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 31) != 31) continue;
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed >= budget) return done();
    if (elapsed >= std::chrono::microseconds(5)) std::this_thread::yield();
  }
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, LocalGroup::State& state, int rank)
      : group_(std::move(group)), state_(state), rank_(rank) {}

  ~LocalCommunicator() override {
    std::lock_guard lock(state_.mutex);
    fail_locked("rank " + std::to_string(rank_) + " left the group");
  }

  int rank() const override { return rank_; }
  int size() const override { return state_.size; }
  const char* backend() const override { return "local"; }

  // all_reduce and all_gatherv stage this rank's input in a buffer of its own, so one rendezvous suffices: peers
  // read the staged copies while this rank already writes its output. Staging buffers alternate with the rendezvous
  // parity; a rank reuses one only after the next rendezvous, when every peer has finished reading it.
  void all_reduce(void* data, size_t count, CommDType dtype, ReduceOp op) override {
    const size_t bytes = count * comm_dtype_size(dtype);
    std::vector<char>& stage = state_.staging[entered_ & 1][static_cast<size_t>(rank_)];
    stage.resize(bytes);
    if (bytes > 0) std::memcpy(stage.data(), data, bytes);
    rendezvous("all_reduce", signature("all_reduce", dtype, count) + reduce_op_name(op), stage.data(), nullptr, nullptr);
    if (bytes == 0) return;
    std::memcpy(data, slot_[0].in, bytes);
    for (int r = 1; r < size(); ++r) reduce_into(data, slot_[r].in, count, dtype, op);
  }

  void all_gatherv(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype) override {
    check_counts(*this, "all_gatherv", "counts", counts);
    const size_t elem = comm_dtype_size(dtype);
    std::vector<char>& stage = state_.staging[entered_ & 1][static_cast<size_t>(rank_)];
    const size_t mine = counts[static_cast<size_t>(rank_)] * elem;
    stage.resize(mine);
    if (mine > 0) std::memcpy(stage.data(), in, mine);
    rendezvous("all_gatherv", signature("all_gatherv", dtype, counts), stage.data(), nullptr, nullptr);
    size_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      const size_t bytes = counts[static_cast<size_t>(r)] * elem;
      if (bytes > 0) std::memcpy(static_cast<char*>(out) + offset, slot_[r].in, bytes);
      offset += bytes;
    }
  }

  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, CommDType dtype, ReduceOp op) override {
    check_counts(*this, "reduce_scatter", "counts", counts);
    const size_t elem = comm_dtype_size(dtype);
    rendezvous("reduce_scatter", signature("reduce_scatter", dtype, counts) + reduce_op_name(op), in, nullptr, nullptr);
    size_t offset = 0;
    for (int r = 0; r < rank_; ++r) offset += counts[static_cast<size_t>(r)];
    const size_t mine = counts[static_cast<size_t>(rank_)];
    scratch_.resize(mine * elem);
    if (mine > 0) {
      std::memcpy(scratch_.data(), static_cast<const char*>(slot_[0].in) + offset * elem, mine * elem);
      for (int r = 1; r < size(); ++r) {
        reduce_into(scratch_.data(), static_cast<const char*>(slot_[r].in) + offset * elem, mine, dtype, op);
      }
    }
    rendezvous("reduce_scatter", "done", nullptr, nullptr, nullptr);
    if (mine > 0) std::memcpy(out, scratch_.data(), mine * elem);
  }

  void all_to_allv(const void* in, const std::vector<size_t>& send_counts, void* out, const std::vector<size_t>& recv_counts,
                   CommDType dtype) override {
    check_counts(*this, "all_to_allv", "send_counts", send_counts);
    check_counts(*this, "all_to_allv", "recv_counts", recv_counts);
    const size_t elem = comm_dtype_size(dtype);
    rendezvous("all_to_allv", signature("all_to_allv", dtype, size_t{0}), in, &send_counts, &recv_counts);
    // Every rank checks every pair in the same order, so all of them fail on the same mismatch before any reads a
    // peer's input (which a failing peer may already have freed).
    for (int q = 0; q < size(); ++q) {
      for (int p = 0; p < size(); ++p) {
        const size_t sent = slot_[p].send_counts[static_cast<size_t>(q)];
        const size_t expected = slot_[q].recv_counts[static_cast<size_t>(p)];
        if (sent == expected) continue;
        const std::string what = "rank " + std::to_string(p) + " sends " + std::to_string(sent) + " elements to rank " +
                                 std::to_string(q) + ", which expects " + std::to_string(expected);
        {
          std::lock_guard lock(state_.mutex);
          fail_locked("all_to_allv: " + what);
        }
        throw_comm_error(*this, "all_to_allv", what);
      }
    }
    scratch_.resize(sum_counts(recv_counts) * elem);
    size_t out_offset = 0;
    for (int p = 0; p < size(); ++p) {
      const auto& theirs = slot_[p].send_counts;
      size_t in_offset = 0;
      for (int q = 0; q < rank_; ++q) in_offset += theirs[static_cast<size_t>(q)];
      const size_t bytes = recv_counts[static_cast<size_t>(p)] * elem;
      if (bytes > 0) {
        std::memcpy(scratch_.data() + out_offset, static_cast<const char*>(slot_[p].in) + in_offset * elem,
                    bytes);
      }
      out_offset += bytes;
    }
    rendezvous("all_to_allv", "done", nullptr, nullptr, nullptr);
    if (!scratch_.empty()) std::memcpy(out, scratch_.data(), scratch_.size());
  }

  void broadcast(void* data, size_t count, CommDType dtype, int root) override {
    check_root(*this, "broadcast", root);
    const size_t bytes = count * comm_dtype_size(dtype);
    rendezvous("broadcast", signature("broadcast", dtype, count) + " root " + std::to_string(root), data, nullptr, nullptr);
    scratch_.resize(bytes);
    if (bytes > 0) std::memcpy(scratch_.data(), slot_[root].in, bytes);
    rendezvous("broadcast", "done", nullptr, nullptr, nullptr);
    if (bytes > 0 && rank_ != root) std::memcpy(data, scratch_.data(), bytes);
  }

  void barrier() override { rendezvous("barrier", "barrier", nullptr, nullptr, nullptr); }

  void abort(const std::string& reason) override {
    std::lock_guard lock(state_.mutex);
    fail_locked("rank " + std::to_string(rank_) + " aborted: " + reason);
  }

 private:
  static std::string signature(const char* op, CommDType dtype, size_t count) {
    return std::string(op) + " " + comm_dtype_name(dtype) + " x" + std::to_string(count) + " ";
  }
  static std::string signature(const char* op, CommDType dtype, const std::vector<size_t>& counts) {
    std::string s = std::string(op) + " " + comm_dtype_name(dtype) + " counts";
    for (size_t c : counts) s += " " + std::to_string(c);
    return s + " ";
  }

  void fail_locked(const std::string& why) {
    if (!state_.failed) {
      state_.failed = true;
      state_.failure = why;
      state_.published_failed.store(true, std::memory_order_release);
    }
    state_.cv.notify_all();
  }

  // Publishes this rank's part and waits until every rank has arrived; then checks that all called the same
  // collective with matching sizes. Throws on timeout, on a failed group and on a mismatch (failing the group).
  void rendezvous(const char* op, std::string sig, const void* in, const std::vector<size_t>* send_counts,
                  const std::vector<size_t>* recv_counts) {
    auto& s = state_;
    std::unique_lock lock(s.mutex);
    if (s.failed) throw_comm_error(*this, op, "the group has failed: " + s.failure);
    const uint64_t gen = s.generation;
    if (gen != entered_) throw Error(ErrorKind::kInternal, "local communicator: rank " + std::to_string(rank_) + " lost count of rendezvous");
    ++entered_;
    Posted& post = s.posted[gen & 1][static_cast<size_t>(rank_)];
    post.signature = std::move(sig);
    post.in = in;
    if (send_counts != nullptr) post.send_counts.assign(send_counts->begin(), send_counts->end());
    if (recv_counts != nullptr) post.recv_counts.assign(recv_counts->begin(), recv_counts->end());
    const uint64_t mine = ++s.arrivals[static_cast<size_t>(rank_)];
    if (++s.arrived == s.size) {
      s.arrived = 0;
      ++s.generation;
      s.published_generation.store(s.generation, std::memory_order_release);
      s.cv.notify_all();
    } else {
      lock.unlock();
      spin_until([&] { return s.published_generation.load(std::memory_order_acquire) != gen || s.published_failed.load(std::memory_order_acquire); },
                 s.spin);
      lock.lock();
      const bool done = s.cv.wait_for(lock, s.timeout, [&] { return s.generation != gen || s.failed; });
      if (s.generation == gen) {
        if (!done) {
          std::string missing;
          for (int r = 0; r < s.size; ++r) {
            if (s.arrivals[static_cast<size_t>(r)] < mine) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          }
          fail_locked(std::string(op) + " timed out after " + std::to_string(s.timeout.count()) + " ms waiting for rank(s) " + missing);
        }
        throw_comm_error(*this, op, s.failure);
      }
    }
    slot_ = s.posted[gen & 1].data();
    const std::string& expected = slot_[rank_].signature;
    for (int r = 0; r < s.size; ++r) {
      const std::string& theirs = slot_[r].signature;
      if (theirs != expected) {
        const std::string what = "ranks disagree: rank " + std::to_string(rank_) + " called '" + expected + "', rank " +
                                 std::to_string(r) + " called '" + theirs + "'";
        fail_locked(what);
        throw_comm_error(*this, op, what);
      }
    }
  }

  std::shared_ptr<LocalGroup> group_;  // keeps state_ alive
  LocalGroup::State& state_;
  int rank_;
  std::vector<char> scratch_;
  uint64_t entered_ = 0;          // rendezvous this rank has entered (= the generation of its next one)
  const Posted* slot_ = nullptr;  // what each rank published for the current collective
};

}  // namespace

LocalGroup::LocalGroup(int size, std::chrono::milliseconds timeout) : state_(std::make_unique<State>()) {
  state_->size = size;
  state_->timeout = timeout;
  // Spinning pays only when every rank can have a core of its own.
  if (static_cast<unsigned>(size) <= std::max(1u, std::thread::hardware_concurrency())) state_->spin = std::chrono::microseconds(200);
  state_->arrivals.assign(static_cast<size_t>(size), 0);
  for (auto& posted : state_->posted) posted.resize(static_cast<size_t>(size));
  for (auto& staging : state_->staging) staging.resize(static_cast<size_t>(size));
  state_->taken.assign(static_cast<size_t>(size), false);
}

LocalGroup::~LocalGroup() = default;

std::shared_ptr<LocalGroup> LocalGroup::create(int size, std::chrono::milliseconds timeout) {
  if (size < 1) throw_usage("a local communicator group needs at least 1 rank, got " + std::to_string(size));
  if (timeout.count() <= 0) throw_usage("the communicator timeout must be positive");
  return std::shared_ptr<LocalGroup>(new LocalGroup(size, timeout));
}

int LocalGroup::size() const { return state_->size; }
std::chrono::milliseconds LocalGroup::timeout() const { return state_->timeout; }

std::unique_ptr<Communicator> LocalGroup::communicator(int rank) {
  if (rank < 0 || rank >= state_->size) {
    throw_usage("rank " + std::to_string(rank) + " is not in a local group of " + std::to_string(state_->size));
  }
  std::lock_guard lock(state_->mutex);
  if (state_->taken[static_cast<size_t>(rank)]) throw_usage("the communicator of local rank " + std::to_string(rank) + " was already taken");
  state_->taken[static_cast<size_t>(rank)] = true;
  return std::make_unique<LocalCommunicator>(shared_from_this(), *state_, rank);
}

}  // namespace servetune
