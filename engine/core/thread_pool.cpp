// ThreadPool: generation-counter fork-join. Workers spin on generation_ for spin_ns_, then sleep on it with a
// futex; the caller counts remaining_ down the same way. Sleep flags + seq_cst ordering make lost wake-ups impossible.
#include "core/thread_pool.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <string>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace servetune {
namespace {

thread_local const ThreadPool* t_current_pool = nullptr;

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins until pred() holds or budget_ns passes; true when pred() held. After the first few microseconds the
// spinner also yields its core, so an oversubscribed pool (more threads than free cores) still makes progress.
template <class Pred>
bool spin_until(Pred pred, int64_t budget_ns) {
  if (budget_ns <= 0) return pred();
  constexpr int64_t kPureSpinNs = 5000;
  const int64_t start = now_ns();
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    const int64_t elapsed = now_ns() - start;
    if (elapsed >= budget_ns) return pred();
    if (elapsed >= kPureSpinNs) std::this_thread::yield();
  }
}

// Spinning only pays when every thread has a core of its own; an oversubscribed pool sleeps at once.
int64_t default_spin_ns(int n_threads) {
  if (const char* env = std::getenv("SERVETUNE_POOL_SPIN_US")) {
    char* end = nullptr;
    const long long us = std::strtoll(env, &end, 10);
    if (end == env || *end != '\0' || us < 0) {
      throw_usage(std::string("SERVETUNE_POOL_SPIN_US must be a non-negative integer (microseconds), got '") + env +
                  "'");
    }
    return static_cast<int64_t>(us) * 1000;
  }
  return n_threads <= available_cpus() ? 200 * 1000 : 0;
}

}  // namespace

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void PhaseBarrier::arrive_and_wait(int n_threads) {
  arrived_.fetch_add(1, std::memory_order_acq_rel);
  auto all_arrived = [&] { return arrived_.load(std::memory_order_acquire) >= n_threads; };
  spin_until(all_arrived, INT64_MAX);  // an unbounded budget: returns only once all have arrived
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads), spin_ns_(default_spin_ns(n_threads)) {
  if (n_threads < 1) throw_usage("thread pool size must be at least 1, got " + std::to_string(n_threads));
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&generation_);
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::in_pool() const { return t_current_pool == this; }

void ThreadPool::execute(int index) {
  try {
    task_(ctx_, index, n_threads_);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
    has_error_.store(true, std::memory_order_relaxed);
  }
}

void ThreadPool::worker_main(int index) {
  t_current_pool = this;
  uint32_t seen = 0;
  for (;;) {
    auto changed = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(changed, spin_ns_.load(std::memory_order_relaxed))) {
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      while (generation_.load(std::memory_order_seq_cst) == seen) futex_wait(&generation_, seen);
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    execute(index);
    if (remaining_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
      futex_wake_all(&remaining_);
    }
  }
}

void ThreadPool::wait_for_workers() {
  auto done = [&] { return remaining_.load(std::memory_order_acquire) == 0; };
  if (spin_until(done, spin_ns_.load(std::memory_order_relaxed))) return;
  caller_sleeping_.store(1, std::memory_order_seq_cst);
  for (;;) {
    const uint32_t left = remaining_.load(std::memory_order_seq_cst);
    if (left == 0) break;
    futex_wait(&remaining_, left);
  }
  caller_sleeping_.store(0, std::memory_order_relaxed);
}

void ThreadPool::run_erased(Task task, void* ctx) {
  if (n_threads_ == 1 || in_pool()) {
    task(ctx, 0, 1);  // single thread, or a nested call: run inline
    return;
  }
  std::lock_guard<std::mutex> lock(run_mutex_);
  task_ = task;
  ctx_ = ctx;
  error_ = nullptr;
  has_error_.store(false, std::memory_order_relaxed);
  remaining_.store(static_cast<uint32_t>(n_threads_ - 1), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_workers_.load(std::memory_order_seq_cst) != 0) futex_wake_all(&generation_);

  const ThreadPool* outer_pool = t_current_pool;
  t_current_pool = this;
  execute(0);
  t_current_pool = outer_pool;
  wait_for_workers();

  if (has_error_.load(std::memory_order_acquire)) {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> error_lock(error_mutex_);
      error = error_;
      error_ = nullptr;
    }
    std::rethrow_exception(error);
  }
}

}  // namespace servetune
