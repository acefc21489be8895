// Read-only memory mapping of a whole file; the mapping lives as long as the object (move-only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace servetune {

class MappedFile {
 public:
  // Maps `path` read-only. Throws Error(kIo) naming the path on failure. An empty file maps to an empty span.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Lets the kernel drop the resident pages that lie wholly inside [p, p + n) (a caller that copied those bytes
  // no longer needs them in memory); they stay readable: touched again, they are read back from the file. Bytes
  // outside the mapping are ignored.
  void drop_pages(const uint8_t* p, size_t n) const;

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace servetune
