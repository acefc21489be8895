// Tests for ThreadPool: every index runs exactly once per run, parallel_for covers [0, n) exactly once,
// exceptions propagate, back-to-back and nested runs, sleeping workers wake, destruction while idle; PhaseBarrier
// holds every thread of a run until all have arrived.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace servetune {
namespace {

TEST(ThreadPool, RejectsNonPositiveSize) {
  EXPECT_THROW(ThreadPool(0), Error);
  EXPECT_THROW(ThreadPool(-3), Error);
}

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  for (int n : {1, 2, 3, 4, 7}) {
    ThreadPool pool(n);
    EXPECT_EQ(pool.size(), n);
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int> bad_count{0};
    pool.run([&](int index, int count) {
      if (count != n || index < 0 || index >= n) {
        bad_count.fetch_add(1);
        return;
      }
      hits[static_cast<size_t>(index)].fetch_add(1);
    });
    EXPECT_EQ(bad_count.load(), 0);
    for (int i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " index=" << i;
  }
}

TEST(ThreadPool, CallerIsThreadZero) {
  ThreadPool pool(3);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::thread::id> ids(3);
  pool.run([&](int index, int) { ids[static_cast<size_t>(index)] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], caller);
  EXPECT_NE(ids[1], caller);
  EXPECT_NE(ids[2], caller);
  EXPECT_NE(ids[1], ids[2]);
}

TEST(ThreadPool, ManyBackToBackRuns) {
  for (int n : {2, 3}) {
    ThreadPool pool(n);
    std::vector<int64_t> per_thread(static_cast<size_t>(n), 0);
    constexpr int kRuns = 5000;
    for (int r = 0; r < kRuns; ++r) pool.run([&](int index, int) { ++per_thread[static_cast<size_t>(index)]; });
    for (int i = 0; i < n; ++i) EXPECT_EQ(per_thread[static_cast<size_t>(i)], kRuns);
  }
}

TEST(ThreadPool, WorkersWakeFromSleep) {
  ThreadPool pool(3);
  pool.set_spin_us(0);  // every wait goes through the futex
  std::atomic<int> total{0};
  for (int r = 0; r < 200; ++r) {
    pool.run([&](int, int) { total.fetch_add(1); });
    if (r % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(total.load(), 600);
  // A caller that waits on a slow worker also sleeps and is woken.
  pool.run([&](int index, int) {
    if (index == 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    total.fetch_add(1);
  });
  EXPECT_EQ(total.load(), 603);
}

TEST(ThreadPool, ExceptionsPropagateAndPoolStaysUsable) {
  ThreadPool pool(3);
  for (int thrower : {0, 1, 2}) {
    EXPECT_THROW(pool.run([&](int index, int) {
      if (index == thrower) throw std::runtime_error("boom");
    }),
                 std::runtime_error);
  }
  // Every thread throws: exactly one exception comes out, and all threads still finished.
  std::atomic<int> finished{0};
  EXPECT_THROW(pool.run([&](int, int) {
    finished.fetch_add(1);
    throw Error(ErrorKind::kInternal, "all");
  }),
               Error);
  EXPECT_EQ(finished.load(), 3);
  std::atomic<int> after{0};
  pool.run([&](int, int) { after.fetch_add(1); });
  EXPECT_EQ(after.load(), 3);
}

TEST(ThreadPool, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  pool.run([&](int index, int n) {
    EXPECT_EQ(index, 0);
    EXPECT_EQ(n, 1);
    EXPECT_EQ(std::this_thread::get_id(), caller);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(pool.run([](int, int) { throw std::logic_error("x"); }), std::logic_error);
}

TEST(ThreadPool, NestedRunExecutesInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.run([&](int, int) {
    pool.run([&](int index, int n) {
      EXPECT_EQ(index, 0);
      EXPECT_EQ(n, 1);
      inner.fetch_add(1);
    });
    pool.parallel_for(100, 1, [&](int64_t begin, int64_t end) { inner.fetch_add(static_cast<int>(end - begin)); });
  });
  EXPECT_EQ(inner.load(), 2 * 101);
}

TEST(PhaseBarrier, NoThreadPassesBeforeAllHaveArrived) {
  for (int n : {1, 2, 3}) {
    ThreadPool pool(n);
    for (int round = 0; round < 200; ++round) {
      std::vector<std::atomic<int>> written(static_cast<size_t>(n));
      std::atomic<int> missed{0};
      PhaseBarrier barrier;
      pool.run([&](int index, int count) {
        // The last thread to arrive is late on purpose, so a barrier that lets anyone through early shows.
        if (index == count - 1 && round % 20 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        written[static_cast<size_t>(index)].store(1);
        barrier.arrive_and_wait(count);
        for (int i = 0; i < count; ++i) {
          if (written[static_cast<size_t>(i)].load() != 1) missed.fetch_add(1);
        }
      });
      ASSERT_EQ(missed.load(), 0) << "n=" << n << " round=" << round;
    }
  }
}

TEST(PhaseBarrier, NestedRunPassesWithItsOneThread) {
  ThreadPool pool(2);
  std::atomic<int> passed{0};
  pool.run([&](int, int) {
    PhaseBarrier barrier;
    pool.run([&](int, int n) {
      barrier.arrive_and_wait(n);
      passed.fetch_add(1);
    });
  });
  EXPECT_EQ(passed.load(), 2);
}

TEST(ThreadPool, ParallelForCoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 17, 100, 1001}) {
      for (int64_t grain : {0, 1, 4, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> ranges{0};
        std::atomic<bool> too_small{false};
        pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
          ranges.fetch_add(1);
          // Ranges are at least `grain` long unless there is only one range.
          if (end - begin < grain && !(begin == 0 && end == n)) too_small.store(true);
          for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "threads=" << threads << " n=" << n << " i=" << i;
        }
        EXPECT_FALSE(too_small.load());
        EXPECT_LE(ranges.load(), threads);
        if (n == 0) {
          EXPECT_EQ(ranges.load(), 0);
        }
      }
    }
  }
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  ThreadPool pool(2);
  std::atomic<int> active{0};
  std::atomic<bool> overlap{false};
  std::atomic<int> total{0};
  auto body = [&] {
    for (int r = 0; r < 2000; ++r) {
      pool.run([&](int index, int) {
        if (index == 0) {
          if (active.fetch_add(1) != 0) overlap.store(true);
          active.fetch_sub(1);
        }
        total.fetch_add(1);
      });
    }
  };
  std::thread other(body);
  body();
  other.join();
  EXPECT_FALSE(overlap.load());
  EXPECT_EQ(total.load(), 2 * 2000 * 2);
}

TEST(ThreadPool, DestructionWhileIdle) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(3);
    if (i % 2 == 0) pool.run([](int, int) {});
    if (i % 5 == 0) {
      pool.set_spin_us(0);
      pool.run([](int, int) {});
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // workers are asleep in the futex now
    }
  }
  SUCCEED();
}

}  // namespace
}  // namespace servetune
