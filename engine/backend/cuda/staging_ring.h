// Where the GPU backend's host-to-device copies stage in its pinned ring buffer (gpu_backend.cu): regions are placed
// one after another, wrapping to the start, and a region still being copied from is waited for (oldest first) before
// the space is written again. Plain C++ (the waiting is a callback), so a CPU test (test_staging_ring) checks it.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>

namespace servetune::gpu {

class StagingRing {
 public:
  // `token` identifies a copy in flight (the GPU backend's event); wait blocks until that copy has read its region.
  using Wait = std::function<void(void* token)>;

  explicit StagingRing(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  size_t in_flight() const { return held_.size(); }

  // The offset of a free region of `bytes` (at most capacity()): after the last one placed, or at 0 when it would run
  // past the end; every held region overlapping it is waited for first and released.
  size_t reserve(size_t bytes, const Wait& wait) {
    const bool wrap = head_ + bytes > capacity_;
    const size_t at = wrap ? 0 : head_;
    // Held regions are in placement order, so the oldest lie just ahead of the head: waiting from the front frees the
    // space in the order it is reused. A wrap skips the tail, whose (older) regions go first.
    while (!held_.empty() &&
           (overlaps(held_.front(), at, bytes) || (wrap && overlaps(held_.front(), head_, capacity_ - head_)))) {
      wait(held_.front().token);
      held_.pop_front();
    }
    head_ = at + bytes;
    return at;
  }
  // Marks [offset, offset + bytes) (just reserved) as read by the copy `token`.
  void hold(size_t offset, size_t bytes, void* token) { held_.push_back({offset, offset + bytes, token}); }
  // Every copy has completed (the stream was synchronized): the held regions' tokens go to `done`, nothing is waited.
  void release_all(const Wait& done) {
    for (const Region& r : held_) done(r.token);
    held_.clear();
  }

 private:
  struct Region {
    size_t begin, end;
    void* token;
  };
  static bool overlaps(const Region& r, size_t at, size_t bytes) { return r.begin < at + bytes && at < r.end; }

  size_t capacity_;
  size_t head_ = 0;
  std::deque<Region> held_;
};

}  // namespace servetune::gpu
