// Fixed-size fork-join thread pool for the CPU kernels (idle workers spin, then sleep on a futex). The calling thread
// is thread 0; run() is blocking, type-erased without allocation, and rethrows the first exception.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace servetune {

// The CPUs this process may run on (its affinity mask: taskset, a Slurm allocation, a parallel sweep's share);
// what threads = 0 ("all cores") means.
int available_cpus();

// Meeting point between two phases of one ThreadPool::run: arrive_and_wait(n) returns once n callers have arrived
// (n: the run's thread count, which fn receives; 1 when the run was nested and ran inline). Cheaper than ending
// the run and starting another. Waiters spin, then also yield. One use per run.
class PhaseBarrier {
 public:
  void arrive_and_wait(int n_threads);

 private:
  alignas(64) std::atomic<int> arrived_{0};
};

class ThreadPool {
 public:
  // `n_threads` counts the calling thread too (n_threads >= 1, else Error(kUsage)).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // How long an idle worker (and a waiting caller) spins before sleeping in the kernel. Default 200 us (0 when the
  // pool has more threads than the process has CPUs), or SERVETUNE_POOL_SPIN_US from the environment.
  // 0 sleeps at once (lowest CPU use, highest wake-up latency).
  void set_spin_us(int64_t us) { spin_ns_.store(us * 1000, std::memory_order_relaxed); }

  // Runs fn(thread_index, n_threads) on every thread and returns when all have finished. A nested call from
  // inside fn runs inline as fn(0, 1); calls from different outside threads are serialised.
  template <class F>
  void run(F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_erased([](void* ctx, int index, int n) { (*static_cast<Fn*>(ctx))(index, n); },
               const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Splits [0, n) into at most size() contiguous ranges of at least `grain` elements (one range when n < 2 * grain)
  // and calls fn(begin, end) once per range, in parallel.
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    const int64_t max_chunks = n / grain;
    const int chunks = static_cast<int>(max_chunks < n_threads_ ? (max_chunks < 1 ? 1 : max_chunks) : n_threads_);
    if (chunks == 1 || in_pool()) {
      fn(int64_t{0}, n);
      return;
    }
    run([&](int index, int) {
      if (index >= chunks) return;
      const int64_t begin = n * index / chunks;
      const int64_t end = n * (index + 1) / chunks;
      fn(begin, end);
    });
  }

 private:
  using Task = void (*)(void* ctx, int index, int n_threads);

  void run_erased(Task task, void* ctx);
  void worker_main(int index);
  void execute(int index);
  bool in_pool() const;
  void wait_for_workers();

  const int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::atomic<int64_t> spin_ns_;

  // Published by run_erased before bumping generation_; read by workers after they observe the bump.
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  std::exception_ptr error_;
  std::mutex error_mutex_;
  std::atomic<bool> has_error_{false};

  // Each on its own cache line: generation_ is polled by the workers, remaining_ by the caller.
  alignas(64) std::atomic<uint32_t> generation_{0};
  std::atomic<uint32_t> sleeping_workers_{0};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<uint32_t> remaining_{0};
  std::atomic<uint32_t> caller_sleeping_{0};
};

}  // namespace servetune
