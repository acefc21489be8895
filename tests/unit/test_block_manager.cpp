// KV block manager: allocation, release, prefix sharing, LRU eviction, and a 10,000-operation property test
// that checks no block leaks and no block is shared unless its contents match.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>

#include "runtime/block_manager.h"

namespace servetune {
namespace {

Sequence make_seq(int64_t id, std::vector<int32_t> tokens) {
  Sequence s;
  s.id = id;
  s.prompt_len = static_cast<int64_t>(tokens.size());
  s.tokens = std::move(tokens);
  return s;
}

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = start + i;
  return t;
}

TEST(BlockManager, AllocateAndRelease) {
  BlockManager bm(8, 4, false);
  Sequence s = make_seq(1, iota_tokens(10));
  bm.begin(s);
  EXPECT_EQ(s.num_computed, 0);
  EXPECT_EQ(bm.blocks_needed(s, 10), 3);
  ASSERT_TRUE(bm.allocate(s, 10));
  EXPECT_EQ(s.block_table.size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  EXPECT_FALSE(bm.allocate(s, 40));  // needs 7 more
  EXPECT_EQ(s.block_table.size(), 3u);
  bm.release(s);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_TRUE(bm.check_invariants());
}

TEST(BlockManager, SharesFullPrefixBlocks) {
  BlockManager bm(16, 4, true);
  Sequence a = make_seq(1, iota_tokens(10));
  bm.begin(a);
  ASSERT_TRUE(bm.allocate(a, 10));
  a.num_computed = 10;
  bm.commit(a);  // two full blocks hashed
  Sequence b = make_seq(2, iota_tokens(12));
  EXPECT_EQ(bm.cached_prefix_tokens(b), 8);
  bm.begin(b);
  EXPECT_EQ(b.num_computed, 8);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_EQ(bm.ref_count(a.block_table[0]), 2);
  // A prompt that is exactly the cached blocks still computes its last token.
  Sequence c = make_seq(3, iota_tokens(8));
  EXPECT_EQ(bm.cached_prefix_tokens(c), 4);
  // Different content never matches.
  Sequence d = make_seq(4, iota_tokens(12, 1));
  EXPECT_EQ(bm.cached_prefix_tokens(d), 0);
  EXPECT_TRUE(bm.check_invariants());
}

TEST(BlockManager, FreedBlocksStayCachedUntilEvicted) {
  BlockManager bm(4, 2, true);
  Sequence a = make_seq(1, iota_tokens(5));
  bm.begin(a);
  ASSERT_TRUE(bm.allocate(a, 5));
  a.num_computed = 5;
  bm.commit(a);
  bm.release(a);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  Sequence b = make_seq(2, iota_tokens(5));
  EXPECT_EQ(bm.cached_prefix_tokens(b), 4);
  // Fill the cache with other content: the cached blocks get evicted.
  Sequence c = make_seq(3, iota_tokens(8, 100));
  bm.begin(c);
  ASSERT_TRUE(bm.allocate(c, 8));
  EXPECT_EQ(bm.cached_prefix_tokens(b), 0);
  EXPECT_TRUE(bm.check_invariants());
}

// Flushing forgets the free blocks' content (a benchmark's cold start); blocks a running sequence holds stay shared.
TEST(BlockManager, FlushForgetsFreeCachedBlocksOnly) {
  BlockManager bm(16, 4, true);
  Sequence a = make_seq(1, iota_tokens(10));
  bm.begin(a);
  ASSERT_TRUE(bm.allocate(a, 10));
  a.num_computed = 10;
  bm.commit(a);
  Sequence held = make_seq(2, iota_tokens(9, 100));
  bm.begin(held);
  ASSERT_TRUE(bm.allocate(held, 9));
  held.num_computed = 9;
  bm.commit(held);
  bm.release(a);
  EXPECT_EQ(bm.cached_prefix_tokens(make_seq(3, iota_tokens(12))), 8);
  EXPECT_EQ(bm.flush_cached(), 2);  // a's two full blocks; held's stay registered
  EXPECT_EQ(bm.cached_prefix_tokens(make_seq(3, iota_tokens(12))), 0);
  EXPECT_EQ(bm.cached_prefix_tokens(make_seq(4, iota_tokens(12, 100))), 8);
  EXPECT_EQ(bm.num_free_blocks(), 16 - 3);
  EXPECT_TRUE(bm.check_invariants());
  EXPECT_EQ(bm.flush_cached(), 0);
}

TEST(BlockManager, AdmissionCountsFreeCachedBlocks) {
  BlockManager bm(3, 2, true);
  Sequence a = make_seq(1, iota_tokens(4));
  bm.begin(a);
  ASSERT_TRUE(bm.allocate(a, 4));
  a.num_computed = 4;
  bm.commit(a);
  bm.release(a);
  Sequence b = make_seq(2, iota_tokens(6));
  EXPECT_TRUE(bm.can_admit(b, 6));  // 2 cached (free) blocks + 1 new = 3
  Sequence c = make_seq(3, iota_tokens(8));
  EXPECT_FALSE(bm.can_admit(c, 8));
}

// Random submit / grow / commit / finish / abort; after each operation every invariant holds, shared blocks hold
// identical tokens, and at the end every block is free.
TEST(BlockManager, PropertyNoLeaksNoFalseSharing) {
  std::mt19937 rng(1234);
  const int64_t page = 4;
  BlockManager bm(64, page, true);
  std::map<int64_t, Sequence> live;
  int64_t next = 0;
  // Prompts from a few shared prefixes so sharing actually happens.
  std::vector<std::vector<int32_t>> prefixes = {iota_tokens(12), iota_tokens(8, 50), iota_tokens(4, 7)};
  for (int op = 0; op < 10000; ++op) {
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0 || live.empty()) {
      auto tokens = prefixes[rng() % prefixes.size()];
      const int extra = static_cast<int>(rng() % 9);
      for (int i = 0; i < extra; ++i) tokens.push_back(static_cast<int32_t>(rng() % 5));
      Sequence s = make_seq(next++, tokens);
      if (!bm.can_admit(s, s.size())) continue;
      bm.begin(s);
      ASSERT_TRUE(bm.allocate(s, s.size()));
      s.num_computed = s.size();
      bm.commit(s);
      live.emplace(s.id, std::move(s));
    } else if (kind == 1) {  // decode a few tokens
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      Sequence& s = it->second;
      const int n = 1 + static_cast<int>(rng() % 6);
      if (!bm.allocate(s, s.size() + n)) continue;
      for (int i = 0; i < n; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 5));
      s.num_computed = s.size();
      bm.commit(s);
    } else {  // finish or abort
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      bm.release(it->second);
      live.erase(it);
    }
    ASSERT_TRUE(bm.check_invariants()) << "op " << op;
    // Every shared block holds the same tokens in every sequence that uses it.
    std::map<int32_t, std::vector<int32_t>> contents;
    int64_t used = 0;
    std::map<int32_t, int> refs;
    for (const auto& [id, s] : live) {
      for (size_t b = 0; b < s.block_table.size(); ++b) {
        ++refs[s.block_table[b]];
        const int64_t begin = static_cast<int64_t>(b) * page;
        const int64_t end = std::min<int64_t>(begin + page, s.num_computed);
        if (end - begin < page) continue;  // partial blocks are never shared
        std::vector<int32_t> chunk(s.tokens.begin() + begin, s.tokens.begin() + end);
        auto [pos, inserted] = contents.emplace(s.block_table[b], chunk);
        ASSERT_TRUE(inserted || pos->second == chunk) << "block " << s.block_table[b] << " shared with different contents";
      }
    }
    for (const auto& [block, n] : refs) {
      ASSERT_EQ(bm.ref_count(block), n) << "block " << block;
      ++used;
    }
    ASSERT_EQ(bm.num_used_blocks(), used);
  }
  for (auto& [id, s] : live) bm.release(s);
  EXPECT_EQ(bm.num_free_blocks(), 64);
  EXPECT_TRUE(bm.check_invariants());
  EXPECT_GT(bm.prefix_hit_tokens(), 0);
}

}  // namespace
}  // namespace servetune
