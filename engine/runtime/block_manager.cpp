// Paged KV-cache bookkeeping with prefix caching (see block_manager.h).
#include "runtime/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace servetune {
namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

BlockManager::BlockManager(int64_t num_blocks, int64_t page_size, bool enable_prefix_caching)
    : num_blocks_(num_blocks), page_size_(page_size), prefix_caching_(enable_prefix_caching) {
  if (num_blocks <= 0 || num_blocks > INT32_MAX) throw_usage("the KV cache must have between 1 and 2^31 blocks");
  if (page_size <= 0) throw_usage("page_size must be positive");
  blocks_.resize(static_cast<size_t>(num_blocks));
  if (prefix_caching_) block_tokens_.resize(static_cast<size_t>(num_blocks * page_size));
  for (int32_t b = 0; b < static_cast<int32_t>(num_blocks); ++b) push_free_back(b);
}

uint64_t BlockManager::chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent + 0x9e3779b97f4a7c15ull);
  for (int32_t t : tokens) h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull));
  return h;
}

bool BlockManager::block_matches(int32_t block, std::span<const int32_t> tokens) const {
  const auto* stored = block_tokens_.data() + static_cast<size_t>(block) * static_cast<size_t>(page_size_);
  return std::equal(tokens.begin(), tokens.end(), stored);
}

int32_t BlockManager::find_cached(uint64_t hash, std::span<const int32_t> tokens) const {
  auto [lo, hi] = by_hash_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    if (block_matches(it->second, tokens)) return it->second;
  }
  return -1;
}

void BlockManager::unlink(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  if (blk.prev >= 0) blocks_[static_cast<size_t>(blk.prev)].next = blk.next; else free_head_ = blk.next;
  if (blk.next >= 0) blocks_[static_cast<size_t>(blk.next)].prev = blk.prev; else free_tail_ = blk.prev;
  blk.prev = blk.next = -1;
  blk.queued = false;
  --num_free_;
}

void BlockManager::push_free_back(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  blk.prev = free_tail_;
  blk.next = -1;
  if (free_tail_ >= 0) blocks_[static_cast<size_t>(free_tail_)].next = b; else free_head_ = b;
  free_tail_ = b;
  blk.queued = true;
  ++num_free_;
}

void BlockManager::forget(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  auto [lo, hi] = by_hash_.equal_range(blk.hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == b) {
      by_hash_.erase(it);
      break;
    }
  }
  blk.hashed = false;
}

int32_t BlockManager::pop_free() {
  const int32_t b = free_head_;
  unlink(b);
  Block& blk = blocks_[static_cast<size_t>(b)];
  if (blk.hashed) forget(b);  // evict: the block's cached content is about to be overwritten
  blk.ref = 1;
  return b;
}

void BlockManager::take(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  if (blk.queued) unlink(b);
  ++blk.ref;
}

std::vector<BlockManager::PrefixMatch> BlockManager::match_prefix(const Sequence& seq) const {
  std::vector<PrefixMatch> matches;
  if (!prefix_caching_ || seq.prompt_logits) return matches;  // such a prompt's every position is computed
  const int64_t max_blocks = (seq.size() - 1) / page_size_;
  std::span<const int32_t> tokens(seq.tokens);
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    auto chunk = tokens.subspan(static_cast<size_t>(i * page_size_), static_cast<size_t>(page_size_));
    parent = chain_hash(parent, chunk);
    const int32_t b = find_cached(parent, chunk);
    if (b < 0) break;
    matches.push_back({b, parent});
  }
  return matches;
}

int64_t BlockManager::cached_prefix_tokens(const Sequence& seq) const {
  return static_cast<int64_t>(match_prefix(seq).size()) * page_size_;
}

bool BlockManager::can_admit(const Sequence& seq, int64_t n_tokens) const {
  const auto matches = match_prefix(seq);
  int64_t cost = (n_tokens + page_size_ - 1) / page_size_ - static_cast<int64_t>(matches.size());
  for (const auto& m : matches) {
    if (blocks_[static_cast<size_t>(m.block)].ref == 0) ++cost;  // reusing a free cached block takes it off the free queue
  }
  return cost <= num_free_;
}

void BlockManager::begin(Sequence& seq) {
  if (!seq.block_table.empty()) throw Error(ErrorKind::kInternal, "BlockManager::begin on a sequence that holds blocks");
  for (const auto& m : match_prefix(seq)) {
    take(m.block);
    seq.block_table.push_back(m.block);
    seq.block_hashes.push_back(m.hash);
  }
  seq.num_computed = static_cast<int64_t>(seq.block_table.size()) * page_size_;
  seq.num_prefix_hit = seq.num_computed;
  if (prefix_caching_) {
    query_tokens_ += seq.size();
    hit_tokens_ += seq.num_computed;
  }
}

int64_t BlockManager::blocks_needed(const Sequence& seq, int64_t n_tokens) const {
  const int64_t total = (n_tokens + page_size_ - 1) / page_size_;
  return std::max<int64_t>(0, total - static_cast<int64_t>(seq.block_table.size()));
}

bool BlockManager::allocate(Sequence& seq, int64_t n_tokens) {
  const int64_t need = blocks_needed(seq, n_tokens);
  if (need > num_free_) return false;
  for (int64_t i = 0; i < need; ++i) seq.block_table.push_back(pop_free());
  return true;
}

void BlockManager::commit(Sequence& seq) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(seq.num_computed / page_size_, static_cast<int64_t>(seq.block_table.size()));
  std::span<const int32_t> tokens(seq.tokens);
  for (auto i = static_cast<int64_t>(seq.block_hashes.size()); i < full; ++i) {
    auto chunk = tokens.subspan(static_cast<size_t>(i * page_size_), static_cast<size_t>(page_size_));
    const uint64_t parent = i == 0 ? 0 : seq.block_hashes[static_cast<size_t>(i - 1)];
    const uint64_t h = chain_hash(parent, chunk);
    seq.block_hashes.push_back(h);
    const int32_t b = seq.block_table[static_cast<size_t>(i)];
    Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.hashed || find_cached(h, chunk) >= 0) continue;  // already shared, or the same content is cached elsewhere
    blk.hashed = true;
    blk.hash = h;
    std::copy(chunk.begin(), chunk.end(), block_tokens_.begin() + static_cast<long>(b) * page_size_);
    by_hash_.emplace(h, b);
  }
}

void BlockManager::truncate(Sequence& seq, int64_t n_tokens) {
  const auto keep = static_cast<size_t>(std::max<int64_t>(0, (n_tokens + page_size_ - 1) / page_size_));
  if (seq.block_hashes.size() > keep) throw Error(ErrorKind::kInternal, "KV truncation below registered blocks");
  while (seq.block_table.size() > keep) {
    const int32_t b = seq.block_table.back();
    seq.block_table.pop_back();
    Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.ref <= 0) throw Error(ErrorKind::kInternal, "KV block released twice");
    if (--blk.ref == 0) push_free_back(b);
  }
}

std::span<const int32_t> BlockManager::cached_tokens(int32_t block) const {
  if (!blocks_[static_cast<size_t>(block)].hashed) return {};
  return std::span<const int32_t>(block_tokens_).subspan(static_cast<size_t>(block) * static_cast<size_t>(page_size_),
                                                         static_cast<size_t>(page_size_));
}

void BlockManager::release(Sequence& seq) {
  // Last blocks first, so a sequence's prefix blocks are the last of its blocks to be evicted.
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    Block& blk = blocks_[static_cast<size_t>(*it)];
    if (blk.ref <= 0) throw Error(ErrorKind::kInternal, "KV block released twice");
    if (--blk.ref == 0) push_free_back(*it);
  }
  seq.block_table.clear();
  seq.block_hashes.clear();
  seq.num_computed = 0;
}

int64_t BlockManager::flush_cached() {
  int64_t flushed = 0;
  for (int32_t b = free_head_; b >= 0; b = blocks_[static_cast<size_t>(b)].next) {
    if (!blocks_[static_cast<size_t>(b)].hashed) continue;
    forget(b);
    ++flushed;
  }
  return flushed;
}

bool BlockManager::check_invariants() const {
  int64_t queued = 0;
  for (int32_t b = free_head_; b >= 0; b = blocks_[static_cast<size_t>(b)].next) {
    if (blocks_[static_cast<size_t>(b)].ref != 0 || !blocks_[static_cast<size_t>(b)].queued) return false;
    if (++queued > num_blocks_) return false;  // cycle
  }
  if (queued != num_free_) return false;
  int64_t hashed = 0;
  for (int32_t b = 0; b < static_cast<int32_t>(num_blocks_); ++b) {
    const Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.ref < 0 || (blk.ref == 0) != blk.queued) return false;
    if (!blk.hashed) continue;
    ++hashed;
    auto [lo, hi] = by_hash_.equal_range(blk.hash);
    if (std::none_of(lo, hi, [b](const auto& kv) { return kv.second == b; })) return false;
  }
  return hashed == static_cast<int64_t>(by_hash_.size());
}

}  // namespace servetune
