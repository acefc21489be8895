// Open-addressing hash tables for the tokenizer's hot lookups: token text -> id (keys are string_views into
// storage the caller keeps alive) and (left id, right id) -> (merge rank, merged id).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace servetune::tok {

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull ^ (s.size() * 0x9E3779B97F4A7C15ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w = 0;
    for (int k = 0; k < 8; ++k) w |= uint64_t{static_cast<uint8_t>(s[i + k])} << (8 * k);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < s.size(); ++i) h = (h ^ static_cast<uint8_t>(s[i])) * 0x100000001b3ull;
  h ^= h >> 32;
  return h * 0x9E3779B97F4A7C15ull;
}

// Maps text to id. insert() keeps the first id inserted for a text.
class StringIdMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    size_ = 0;
  }
  // Returns false when the text was already present.
  bool insert(std::string_view key, int32_t id) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    return insert_no_grow(key, id);
  }
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && s.key == key) return s.id;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    std::string_view key;
    int32_t id = -1;
  };
  bool insert_no_grow(std::string_view key, int32_t id) {
    uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{h, key, id};
        ++size_;
        return true;
      }
      if (s.hash == h && s.key == key) return false;
    }
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reserve(old.size() < 16 ? 16 : old.size());
    for (const Slot& s : old) {
      if (s.id >= 0) insert_no_grow(s.key, s.id);
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

struct Merge {
  int32_t rank = -1;  // -1: no merge for this pair
  int32_t result = -1;
};

// (left, right) symbol ids -> merge. insert() keeps the first (lowest-rank) entry for a pair.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    size_ = 0;
  }
  void insert(int32_t left, int32_t right, Merge m) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    insert_no_grow(key(left, right), m);
  }
  Merge find(int32_t left, int32_t right) const {
    if (slots_.empty()) return {};
    uint64_t k = key(left, right);
    for (size_t i = mix(k) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.merge.rank < 0) return {};
      if (s.key == k) return s.merge;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = 0;
    Merge merge;
  };
  static uint64_t key(int32_t l, int32_t r) {
    return (uint64_t{static_cast<uint32_t>(l)} << 32) | static_cast<uint32_t>(r);
  }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ull;
    return k ^ (k >> 29);
  }
  void insert_no_grow(uint64_t k, Merge m) {
    for (size_t i = mix(k) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.merge.rank < 0) {
        s = Slot{k, m};
        ++size_;
        return;
      }
      if (s.key == k) return;
    }
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reserve(old.size() < 16 ? 16 : old.size());
    for (const Slot& s : old) {
      if (s.merge.rank >= 0) insert_no_grow(s.key, s.merge);
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace servetune::tok
