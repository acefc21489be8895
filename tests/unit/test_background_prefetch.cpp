// Tests for the CPU backend's background prefetch: which cache rows an attention batch lists, and that each
// thread's walk covers exactly its share of the ranges, line by line, and stops when cleared or republished.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "backend/cpu/background_prefetch.h"

namespace servetune::cpu {
namespace {

// Lines (64-byte offsets into a range) a walk visits, replaying background_prefetch_step's bookkeeping: the step
// itself only issues prefetches, so the test follows the cursor between steps.
std::set<std::pair<int64_t, int64_t>> visited(PrefetchCursor* c) {
  std::set<std::pair<int64_t, int64_t>> lines;
  for (int guard = 0; guard < 100000 && c->index < c->count; ++guard) {
    const int64_t index = c->index, offset = c->offset;
    background_prefetch_step(c);
    // Everything from (index, offset) up to the cursor's new place was fetched.
    for (int64_t i = index, o = offset; i < c->count && (i != c->index || o != c->offset);) {
      lines.insert({i, o});
      o += 64;
      if (o >= c->ranges[i].bytes) o = 0, i += c->stride;
    }
  }
  EXPECT_GE(c->index, c->count) << "the walk never finished";
  return lines;
}

TEST(BackgroundPrefetch, ThreadsShareTheRangesLineByLine) {
  std::vector<char> memory(4096);
  const std::vector<PrefetchRange> ranges = {
      {memory.data(), 64}, {memory.data() + 256, 130}, {memory.data() + 1024, 1}, {memory.data() + 2048, 640}};
  BackgroundPrefetch prefetch;
  EXPECT_FALSE(prefetch.active());
  prefetch.publish(ranges, 3);
  EXPECT_TRUE(prefetch.active());
  std::set<std::pair<int64_t, int64_t>> all;
  for (int t = 0; t < 3; ++t) {
    for (const auto& line : visited(prefetch.cursor(t))) {
      EXPECT_EQ(line.first % 3, t) << "thread " << t << " fetched range " << line.first;
      EXPECT_TRUE(all.insert(line).second) << "line fetched twice";
    }
  }
  // Every line of every range exactly once: 1 + 3 + 1 + 10 lines.
  EXPECT_EQ(all.size(), 15u);
  EXPECT_TRUE(all.count({1, 128}) == 1 && all.count({3, 576}) == 1);
}

TEST(BackgroundPrefetch, ClearAndRepublishRestartTheWalks) {
  std::vector<char> memory(1 << 16);
  BackgroundPrefetch prefetch;
  prefetch.publish({{memory.data(), 1 << 16}}, 2);
  background_prefetch_step(prefetch.cursor(0));
  EXPECT_GT(prefetch.cursor(0)->offset, 0);
  prefetch.clear();
  EXPECT_FALSE(prefetch.active());
  EXPECT_GE(prefetch.cursor(0)->index, prefetch.cursor(0)->count);
  background_prefetch_step(prefetch.cursor(0));  // a finished walk fetches nothing and stays finished
  EXPECT_GE(prefetch.cursor(0)->index, prefetch.cursor(0)->count);
  prefetch.publish({{memory.data(), 128}, {memory.data() + 512, 64}}, 2);
  EXPECT_EQ(prefetch.cursor(0)->offset, 0);
  EXPECT_EQ(visited(prefetch.cursor(0)).size(), 2u);  // range 0: two lines
  EXPECT_EQ(visited(prefetch.cursor(1)).size(), 1u);  // range 1: one line
  background_prefetch_step(nullptr);                  // no walk: nothing to do
}

TEST(BackgroundPrefetch, AttentionRangesFollowTheBlockTables) {
  // Pages of 4 slots; a slot of 2 KV heads x 8 dims in f16 is 32 bytes. Sequence 0 has 6 visible positions in
  // blocks 5 and 2; sequence 1 (a prefill chunk: three tokens) sees 3 positions in block 7.
  std::vector<char> k(10 * 4 * 32), v(k.size());
  const KvLayerView kv{k.data(), v.data(), DType::kF16, 10, 4, 2, 8};
  const int32_t positions[] = {5, 0, 1, 2};
  const int32_t seq_of_token[] = {0, 1, 1, 1};
  const int32_t tables[] = {5, 2, 7, 0};  // two blocks per sequence
  const AttentionBatch batch{4, positions, seq_of_token, tables, 2};
  const std::vector<PrefetchRange> ranges = attention_cache_ranges(kv, batch, 1 << 20);
  ASSERT_EQ(ranges.size(), 6u);
  auto expect = [&](size_t i, const std::vector<char>& cache, int64_t block, int64_t slots) {
    EXPECT_EQ(ranges[i].begin, cache.data() + block * 4 * 32) << i;
    EXPECT_EQ(ranges[i].bytes, slots * 32) << i;
  };
  expect(0, k, 5, 4);
  expect(1, v, 5, 4);
  expect(2, k, 2, 4);  // K: the whole block, transposed within it
  expect(3, v, 2, 2);
  expect(4, k, 7, 4);
  expect(5, v, 7, 3);
  // Listing stops once max_bytes are listed: sequence 0's first block (2 x 128 bytes) is enough for 200.
  EXPECT_EQ(attention_cache_ranges(kv, batch, 200).size(), 2u);
}

}  // namespace
}  // namespace servetune::cpu
