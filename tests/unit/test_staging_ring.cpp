// The GPU backend's pinned staging ring (backend/cuda/staging_ring.h) on the CPU: a reserved region never overlaps one
// still held (with random sizes, wraps and copies that complete late), copies are waited for oldest first and only
// when their space is needed, and release_all hands back every token without waiting.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/staging_ring.h"

namespace servetune::gpu {
namespace {

struct Held {
  size_t begin, end;
  intptr_t token;
};

TEST(StagingRing, ReservedRegionsNeverOverlapHeldOnes) {
  std::mt19937 rng(1);
  for (size_t capacity : {size_t{64}, size_t{1000}, size_t{4096}}) {
    StagingRing ring(capacity);
    std::vector<Held> held;  // what the test believes is held, in placement order
    std::vector<intptr_t> waited;
    intptr_t next = 1;
    for (int i = 0; i < 20000; ++i) {
      const size_t bytes = 1 + rng() % (rng() % 4 == 0 ? capacity : capacity / 8 + 1);
      waited.clear();
      const size_t at = ring.reserve(bytes, [&](void* token) { waited.push_back(reinterpret_cast<intptr_t>(token)); });
      ASSERT_LE(at + bytes, capacity);
      // Waits are the oldest held copies, in order.
      ASSERT_LE(waited.size(), held.size());
      for (size_t w = 0; w < waited.size(); ++w) ASSERT_EQ(waited[w], held[w].token) << "wait " << w << " at step " << i;
      held.erase(held.begin(), held.begin() + static_cast<long>(waited.size()));
      for (const Held& h : held) {
        ASSERT_FALSE(h.begin < at + bytes && at < h.end)
            << "step " << i << ": [" << at << ", " << at + bytes << ") overlaps held [" << h.begin << ", " << h.end << ")";
      }
      ring.hold(at, bytes, reinterpret_cast<void*>(next));
      held.push_back({at, at + bytes, next++});
      ASSERT_EQ(ring.in_flight(), held.size());
      if (rng() % 97 == 0) {  // a stream synchronize: everything completed
        size_t returned = 0;
        ring.release_all([&](void*) { ++returned; });
        ASSERT_EQ(returned, held.size());
        held.clear();
      }
    }
  }
}

TEST(StagingRing, WaitsOnlyWhenTheSpaceIsReused) {
  StagingRing ring(100);
  int waits = 0;
  const auto count = [&](void*) { ++waits; };
  EXPECT_EQ(ring.reserve(40, count), 0u);
  ring.hold(0, 40, nullptr);
  EXPECT_EQ(ring.reserve(40, count), 40u);
  ring.hold(40, 40, nullptr);
  EXPECT_EQ(waits, 0);
  EXPECT_EQ(ring.reserve(30, count), 0u);  // wraps: the first region (and the skipped tail, empty) waited for
  EXPECT_EQ(waits, 1);
  ring.hold(0, 30, nullptr);
  EXPECT_EQ(ring.reserve(10, count), 30u);  // fits between the new region and the second: the second is still held
  EXPECT_EQ(waits, 1);
}

}  // namespace
}  // namespace servetune::gpu
