// The supervisor's side of ServerProcess (server_process.h): what runs in the forked child. It allocates nothing
// and calls only async-signal-safe functions, because the sweep that forked it may have other threads.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace servetune::tuner {

// Messages on the supervisor's pipe to the sweep: fixed size, so one write is one message.
struct SupervisorMessage {
  enum Kind : int32_t { kShellStarted = 1, kShellExited = 2 };
  int32_t kind = 0;
  int32_t value = 0;  // the shell's pid, or its wait status
};

struct SupervisorArgs {
  pid_t sweep = 0;        // the parent; the supervisor exits at once when it is already gone
  int message_fd = -1;    // write end of the pipe to the sweep
  int log_fd = -1;        // the server's stdout and stderr
  const char* command = nullptr;  // for /bin/sh -c
  char* const* envp = nullptr;
  double stop_grace_s = 0.0;
};

// Never returns: starts the shell, reports its pid and its exit on the pipe, and on SIGTERM/SIGINT/SIGHUP (sent by
// the sweep, or by the kernel when the sweep dies) stops the whole tree and exits.
[[noreturn]] void run_supervisor(const SupervisorArgs& args);

}  // namespace servetune::tuner
