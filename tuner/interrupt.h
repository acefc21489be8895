// Ctrl-C, SIGTERM and SIGHUP during a sweep. The first signal stops the running candidate at once (SIGTERM to its
// server's supervisor, or to the built-in trial's process), so its trial ends, is recorded as interrupted and is
// run again by --resume; the sweep then writes its report and exits. A second signal ends the sweep at once (the
// supervisors still stop their servers: they die with the sweep).
#pragma once

#include <sys/types.h>

#include <string>

namespace servetune::tuner {

// Installs the handlers for its lifetime (the previous ones come back after).
class InterruptHandlers {
 public:
  InterruptHandlers();
  ~InterruptHandlers();
  InterruptHandlers(const InterruptHandlers&) = delete;
  InterruptHandlers& operator=(const InterruptHandlers&) = delete;
};

// The signal that interrupted the sweep, or 0.
int interrupted_by();
// The process the first signal stops (0: none). Set while a candidate runs.
void set_interrupt_target(pid_t pid);
// In a forked child that must not inherit the sweep's handlers: the default actions again.
void reset_interrupt_handlers();
// "SIGINT", "SIGTERM", ...
const char* signal_name(int sig);
// An interrupted trial's reason: "the sweep was interrupted by SIGINT during the trial".
std::string interruption_reason();

}  // namespace servetune::tuner
