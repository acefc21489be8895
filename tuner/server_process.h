// One external server process: `/bin/sh -c COMMAND` in its own session (process group) with stdout and stderr
// appended to a log file; stop() signals the whole group (SIGTERM, then SIGKILL after a grace period) and reaps it.
// The child also gets SIGTERM if the sweep dies (PR_SET_PDEATHSIG), so a killed sweep does not leave it serving.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>

namespace servetune::tuner {

class ServerProcess {
 public:
  // Throws Error(kIo) when the log cannot be opened or fork fails.
  ServerProcess(const std::string& command, const std::map<std::string, std::string>& env, const std::string& log_path);
  ~ServerProcess();  // stop(5)
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The wait status once the shell has exited (non-blocking); nullopt while it runs.
  std::optional<int> poll();
  // Terminates the process group and reaps the shell; idempotent.
  void stop(double grace_s);
  bool stopped_by_us() const { return stopped_by_us_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  bool stopped_by_us_ = false;
};

// How a wait status reads in a message: "exit status 1", "signal 9 (Killed)".
std::string describe_wait_status(int status);
// A free TCP port on 127.0.0.1 (bind to 0, read it back, close).
int free_port();
// The last `n` lines of a file (for failure messages).
std::string tail_lines(const std::string& path, size_t n);
// True when the log shows an out-of-memory failure (CUDA/HIP/torch OOM, bad_alloc, ...).
bool log_shows_oom(const std::string& path);

}  // namespace servetune::tuner
