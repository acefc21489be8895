// MappedFile: the mapping reads the file's bytes, and drop_pages gives back the resident pages inside a range while
// every byte stays readable (read back from the file).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace servetune {
namespace {

// Resident kB of the mapping that holds `p`, from /proc/self/smaps.
int64_t resident_kb(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto address = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {  // a mapping's header line
      inside = address >= begin && address < end;
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      return std::stoll(line.substr(4));
    }
  }
  return -1;
}

TEST(MappedFile, DropPagesKeepsEveryByteReadable) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t size = 64 * page + 100;
  std::vector<uint8_t> pattern(size);
  for (size_t i = 0; i < size; ++i) pattern[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::string path = ::testing::TempDir() + "/mapped_file_drop.bin";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(pattern.data()), static_cast<std::streamsize>(size));
  MappedFile file(path);
  ASSERT_EQ(file.size(), size);
  uint64_t sum = 0;
  for (size_t i = 0; i < size; i += page) sum += file.data()[i];  // every page resident
  EXPECT_GT(sum, 0u);
  const int64_t before = resident_kb(file.data());
  EXPECT_GE(before, static_cast<int64_t>(64 * page / 1024));
  // Pages wholly inside [100, 100 + 40 pages): 39 of them.
  file.drop_pages(file.data() + 100, 40 * page);
  const int64_t after = resident_kb(file.data());
  EXPECT_LE(after, before - static_cast<int64_t>(39 * page / 1024)) << "before " << before << " kB";
  EXPECT_EQ(std::vector<uint8_t>(file.data(), file.data() + size), pattern);  // read back from the file
  // Ranges reaching outside the mapping, or wholly outside it, are clipped or ignored.
  file.drop_pages(file.data() + size - 10, 1 << 20);
  file.drop_pages(pattern.data(), pattern.size());
  EXPECT_EQ(std::vector<uint8_t>(file.data(), file.data() + size), pattern);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace servetune
