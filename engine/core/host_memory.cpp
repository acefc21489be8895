// Host memory sizes from sysconf and /proc/meminfo (see host_memory.h).
#include "core/host_memory.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace servetune {

int64_t physical_host_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

int64_t available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace servetune
