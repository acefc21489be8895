// Sweep interruption (see interrupt.h). The handler only stores the signal, sends one kill(2) and writes one fixed
// line: everything else happens in the sweep's own flow, which checks interrupted_by().
#include "tuner/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace servetune::tuner {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_target = 0;
struct sigaction g_previous[3];

void on_signal(int sig) {
  if (g_signal != 0) {  // the second: end now
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
    return;
  }
  g_signal = sig;
  if (g_target > 0) ::kill(static_cast<pid_t>(g_target), SIGTERM);
  static const char kMessage[] =
      "\nservetune: interrupted: stopping the running candidate, then writing the report (again to quit at once)\n";
  (void)!::write(2, kMessage, sizeof(kMessage) - 1);
}

}  // namespace

InterruptHandlers::InterruptHandlers() {
  g_signal = 0;
  g_target = 0;
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  ::sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < 3; ++i) {
    ::sigaction(kSignals[i], nullptr, &g_previous[i]);
    // An ignored signal stays ignored: `nohup servetune sweep` must survive the SIGHUP of a closed terminal.
    if (g_previous[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &sa, nullptr);
  }
}

InterruptHandlers::~InterruptHandlers() {
  for (size_t i = 0; i < 3; ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
  g_target = 0;
}

int interrupted_by() { return g_signal; }

void set_interrupt_target(pid_t pid) { g_target = pid; }

void reset_interrupt_handlers() {
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  for (int sig : kSignals) ::sigaction(sig, &dfl, nullptr);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

std::string interruption_reason() {
  return std::string("the sweep was interrupted by ") + signal_name(interrupted_by()) + " during the trial";
}

}  // namespace servetune::tuner
