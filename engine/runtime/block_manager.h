// Paged KV-cache bookkeeping: a fixed pool of blocks, per-sequence block tables, and prefix caching by chained
// block hashes. Freed blocks keep their hash and stay reusable until evicted in LRU order.
// Invariants: a block is in the free queue iff its ref count is 0; a block is shared (ref > 1) only when it holds
// a full, hashed block whose tokens equal the requester's (hashes are verified against the stored tokens).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/sequence.h"

namespace servetune {

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int64_t page_size, bool enable_prefix_caching);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t page_size() const { return page_size_; }
  int64_t num_free_blocks() const { return num_free_; }
  int64_t num_used_blocks() const { return num_blocks_ - num_free_; }
  bool prefix_caching() const { return prefix_caching_; }

  // Number of leading prompt tokens of `seq` that the cache holds (whole blocks, never the last token).
  int64_t cached_prefix_tokens(const Sequence& seq) const;

  // True when `seq` (holding no blocks) can be started and grown to `n_tokens` tokens with the free blocks.
  bool can_admit(const Sequence& seq, int64_t n_tokens) const;
  // Starts a sequence with no blocks: takes the cached prefix blocks (if any) and sets num_computed to them.
  void begin(Sequence& seq);
  // Blocks still needed for `seq` to hold `n_tokens` tokens in total.
  int64_t blocks_needed(const Sequence& seq, int64_t n_tokens) const;
  // Grows seq's block table to hold `n_tokens` tokens; false (and no change) when there are not enough free blocks.
  bool allocate(Sequence& seq, int64_t n_tokens);
  // Releases the blocks of seq beyond those holding its first `n_tokens` tokens (speculative rollback); the
  // released blocks hold no registered hash (only blocks within num_computed are ever registered).
  void truncate(Sequence& seq, int64_t n_tokens);
  // Registers the hashes of seq's full blocks among its first `seq.num_computed` tokens, so others can share them.
  void commit(Sequence& seq);
  // Releases every block of seq (finished, aborted or preempted) and resets its cache state.
  void release(Sequence& seq);
  // Forgets the cached content of every free block (SGLang's /flush_cache, vLLM's reset_prefix_cache): later
  // requests find no prefix there. Blocks that running sequences hold stay shared. Returns the blocks forgotten.
  int64_t flush_cached();

  // Statistics: prefix-cache hits over lookups, in tokens.
  int64_t prefix_query_tokens() const { return query_tokens_; }
  int64_t prefix_hit_tokens() const { return hit_tokens_; }

  // For tests: every block's ref count and the consistency of the free queue and the hash table.
  int32_t ref_count(int32_t block) const { return blocks_[static_cast<size_t>(block)].ref; }
  bool check_invariants() const;
  // For tests: the tokens a block is registered with in the prefix cache (empty when it is not registered).
  std::span<const int32_t> cached_tokens(int32_t block) const;

 private:
  struct Block {
    int32_t ref = 0;
    bool hashed = false;
    uint64_t hash = 0;
    int32_t prev = -1;  // free-queue links
    int32_t next = -1;
    bool queued = false;
  };

  struct PrefixMatch {
    int32_t block;
    uint64_t hash;
  };
  std::vector<PrefixMatch> match_prefix(const Sequence& seq) const;
  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens);
  bool block_matches(int32_t block, std::span<const int32_t> tokens) const;
  int32_t find_cached(uint64_t hash, std::span<const int32_t> tokens) const;
  void forget(int32_t b);  // drops a hashed block from the prefix cache (its content stays until overwritten)
  int32_t pop_free();
  void push_free_back(int32_t b);
  void unlink(int32_t b);
  void take(int32_t b);  // ref++ (removing from the free queue if it was there)

  int64_t num_blocks_;
  int64_t page_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> block_tokens_;  // [num_blocks * page_size] tokens of hashed blocks, for verification
  std::unordered_multimap<uint64_t, int32_t> by_hash_;
  int32_t free_head_ = -1;
  int32_t free_tail_ = -1;
  int64_t num_free_ = 0;
  int64_t query_tokens_ = 0;
  int64_t hit_tokens_ = 0;
};

}  // namespace servetune
