// The host's memory as the OS reports it: physical RAM and what /proc/meminfo calls MemAvailable (what a new
// allocation can get without swapping), for sizing and for the device probe on the cpu.
#pragma once

#include <cstdint>

namespace servetune {

// Physical RAM in bytes (sysconf); 0 when the OS does not say.
int64_t physical_host_memory();
// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
int64_t available_host_memory();

}  // namespace servetune
