// One external server process under a supervisor. The sweep forks the supervisor (a session of its own, dies with
// the sweep through PR_SET_PDEATHSIG, and adopts orphans as a child subreaper); the supervisor runs `/bin/sh -c
// COMMAND` in a process group of its own with stdout and stderr appended to a log file. On stop(), on SIGTERM, or
// when the sweep dies by any signal (kill -9 included), the supervisor signals the shell's group and every
// descendant it can find (detached ones included: they were re-parented to it), SIGTERM then SIGKILL after the
// grace period, and exits.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace servetune::tuner {

class ServerProcess {
 public:
  // Throws Error(kIo) when the log cannot be opened or the processes cannot be started.
  ServerProcess(const std::string& command, const std::map<std::string, std::string>& env, const std::string& log_path,
                double stop_grace_s);
  ~ServerProcess();  // stop()
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t supervisor_pid() const { return supervisor_; }
  uint64_t supervisor_start_ticks() const { return supervisor_start_ticks_; }
  pid_t shell_pid() const { return shell_; }  // also the id of the server's process group
  // The shell's wait status once it has exited (non-blocking); nullopt while it runs.
  std::optional<int> poll();
  // True when `pid` is the supervisor or one of its descendants (the launched tree).
  bool launched(pid_t pid) const;
  // Stops the tree (SIGTERM, SIGKILL after the grace period) and reaps the supervisor; idempotent.
  void stop();
  bool stopped_by_us() const { return stopped_by_us_; }

 private:
  void read_messages();

  pid_t supervisor_ = -1;
  pid_t shell_ = -1;
  uint64_t supervisor_start_ticks_ = 0;
  int messages_ = -1;  // read end of the supervisor's pipe
  double stop_grace_s_;
  std::optional<int> status_;
  bool supervisor_reaped_ = false;
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
