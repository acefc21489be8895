// What /proc says about processes: parent, group, session and start time of each, the descendants of a process,
// and which processes own a listening TCP socket on a port. The sweep uses it to tell its own server from a stray
// one on the same port and to find what a killed sweep left running.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace servetune::tuner {

struct ProcessStat {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgid = 0;
  pid_t sid = 0;
  uint64_t start_ticks = 0;  // clock ticks after boot (field 22 of /proc/PID/stat): a pid with another start is another process
};

// Parses the text of /proc/PID/stat (comm may hold spaces and parentheses). Allocates nothing, so a forked child of
// a threaded process may call it.
bool parse_proc_stat(const char* text, size_t size, ProcessStat& out);

// The process's stat; nullopt when it is gone (or /proc cannot be read).
std::optional<ProcessStat> read_process_stat(pid_t pid);
// Every process this user can see.
std::vector<ProcessStat> all_process_stats();
// The processes whose parent chain reaches `root` (not root itself), in `all`.
std::vector<pid_t> descendants_of(pid_t root, const std::vector<ProcessStat>& all);
// The processes owning a listening TCP socket (IPv4 or IPv6) on `port`, among those whose file descriptors this
// user can read; empty when none is visible.
std::vector<pid_t> tcp_port_listeners(int port);
// "pid 1234 (python3 -m sglang.launch_server --port 8000 ...)", the command line cut at 120 characters.
std::string describe_process(pid_t pid);
// True when something accepts a TCP connection on host:port within timeout_ms.
bool tcp_port_accepts(const std::string& host, int port, int timeout_ms);

}  // namespace servetune::tuner
