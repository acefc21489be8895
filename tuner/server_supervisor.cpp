// The server supervisor (see server_supervisor.h). Descendants are found by scanning /proc with raw system calls
// into static tables: a server that detaches (setsid, double fork) is still found, because the supervisor is a child
// subreaper and every orphan below it is re-parented to it.
#include "tuner/server_supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include "tuner/process_tree.h"

namespace servetune::tuner {
namespace {

constexpr int kMaxProcesses = 1 << 16;
pid_t g_pid[kMaxProcesses];
pid_t g_parent[kMaxProcesses];
bool g_below[kMaxProcesses];

struct LinuxDirent64 {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

void send(int fd, SupervisorMessage::Kind kind, int32_t value) {
  SupervisorMessage m;
  m.kind = kind;
  m.value = value;
  (void)!::write(fd, &m, sizeof(m));
}

double now_s() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

void sleep_ms(long ms) {
  timespec t{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// Fills g_pid/g_parent from /proc; returns the count.
int scan_processes() {
  const int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  int count = 0;
  alignas(8) char entries[8192];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dir, entries, sizeof(entries));
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      const auto* e = reinterpret_cast<const LinuxDirent64*>(entries + off);
      off += e->reclen;
      if (e->name[0] < '1' || e->name[0] > '9' || count == kMaxProcesses) continue;
      char path[64] = "/proc/";
      size_t len = 6;
      for (const char* c = e->name; *c != '\0' && len < sizeof(path) - 6; ++c) path[len++] = *c;
      for (const char* c = "/stat"; *c != '\0'; ++c) path[len++] = *c;
      path[len] = '\0';
      const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      char text[2048];
      const ssize_t got = ::read(fd, text, sizeof(text));
      ::close(fd);
      ProcessStat s;
      if (got <= 0 || !parse_proc_stat(text, static_cast<size_t>(got), s)) continue;
      g_pid[count] = s.pid;
      g_parent[count] = s.ppid;
      ++count;
    }
  }
  ::close(dir);
  return count;
}

// Sends `sig` to the shell's group and to every live descendant of this process; returns how many descendants
// were found.
int signal_tree(pid_t shell, int sig) {
  if (shell > 0) ::kill(-shell, sig);
  const int count = scan_processes();
  const pid_t self = ::getpid();
  for (int i = 0; i < count; ++i) g_below[i] = g_parent[i] == self;
  for (bool grew = true; grew;) {
    grew = false;
    for (int i = 0; i < count; ++i) {
      if (g_below[i]) continue;
      for (int j = 0; j < count; ++j) {
        if (g_below[j] && g_pid[j] == g_parent[i]) {
          g_below[i] = grew = true;
          break;
        }
      }
    }
  }
  int found = 0;
  for (int i = 0; i < count; ++i) {
    if (!g_below[i]) continue;
    ::kill(g_pid[i], sig);
    ++found;
  }
  return found;
}

// Reaps every exited child; reports the shell's exit once.
void reap(int message_fd, pid_t shell, bool& shell_reported) {
  int status = 0;
  pid_t p;
  while ((p = ::waitpid(-1, &status, WNOHANG)) > 0) {
    if (p == shell && !shell_reported) {
      send(message_fd, SupervisorMessage::kShellExited, status);
      shell_reported = true;
    }
  }
}

[[noreturn]] void stop_tree(const SupervisorArgs& a, pid_t shell, bool& shell_reported) {
  signal_tree(shell, SIGTERM);
  const double deadline = now_s() + a.stop_grace_s;
  for (;;) {
    reap(a.message_fd, shell, shell_reported);
    // Only zombies left (children exited but not yet reaped) would still count: reap first, then look.
    if (signal_tree(shell, 0) == 0 || now_s() >= deadline) break;
    sleep_ms(50);
  }
  // SIGKILL until nothing is left; a killed parent's children come to us and are killed on the next round.
  for (int round = 0; round < 100; ++round) {
    reap(a.message_fd, shell, shell_reported);
    if (signal_tree(shell, SIGKILL) == 0) break;
    sleep_ms(20);
  }
  reap(a.message_fd, shell, shell_reported);
  ::_exit(0);
}

}  // namespace

void run_supervisor(const SupervisorArgs& a) {
  sigset_t waited;
  ::sigemptyset(&waited);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) ::sigaddset(&waited, sig);
  ::sigprocmask(SIG_BLOCK, &waited, nullptr);  // before PDEATHSIG: its SIGTERM must wait for us, not kill us
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGCHLD, &dfl, nullptr);  // ignored SIGCHLD would auto-reap the shell and hide its status
  struct sigaction ign{};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ign, nullptr);  // the sweep may be gone when we report
  ::setsid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != a.sweep) ::_exit(0);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t shell = ::fork();
  if (shell < 0) ::_exit(127);
  if (shell == 0) {
    ::setpgid(0, 0);
    ::sigaction(SIGPIPE, &dfl, nullptr);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(a.log_fd, 1);
    ::dup2(a.log_fd, 2);
    const char* argv[] = {"/bin/sh", "-c", a.command, nullptr};
    ::execve("/bin/sh", const_cast<char* const*>(argv), a.envp);
    ::_exit(127);
  }
  ::setpgid(shell, shell);  // also here: the sweep may signal the group before the child has run
  send(a.message_fd, SupervisorMessage::kShellStarted, shell);
  bool shell_reported = false;
  for (;;) {
    const int sig = ::sigwaitinfo(&waited, nullptr);
    if (sig == SIGCHLD) {
      reap(a.message_fd, shell, shell_reported);
    } else if (sig > 0) {
      stop_tree(a, shell, shell_reported);
    }
  }
}

}  // namespace servetune::tuner
