// Multi-process test plumbing: a free localhost port, and this test binary re-run as a child process that runs one
// named test case (the case reads its instructions from an environment variable the parent sets).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

extern char** environ;

namespace servetune::testing {

// A port that was free a moment ago (the OS may hand it out again; good enough on a test machine).
// Whether a TCP listener could bind 127.0.0.1:`port` now.
inline bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return free;
}

// The first of `count` consecutive free ports (a DP-attention group listens on port + r for every replica r), drawn
// below the kernel's ephemeral range, where free_port() and outgoing connections of concurrent tests take theirs.
inline int free_port_run(int count) {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 2654435761u ^
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (;;) {
    const int base = 20000 + static_cast<int>(rng() % 10000);
    bool all = true;
    for (int p = base; p < base + count && all; ++p) all = port_is_free(p);
    if (all) return base;
  }
}

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// This binary, run with --gtest_filter=`test_case` and `env_entry` ("NAME=VALUE") added to the environment. The
// destructor kills a child still running and reaps it.
class ChildProcess {
 public:
  ChildProcess(const std::string& test_case, const std::string& env_entry) {
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    std::string env = env_entry;
    envp.push_back(env.data());
    envp.push_back(nullptr);
    std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
    std::string filter = "--gtest_filter=" + test_case;
    char* argv[] = {exe.data(), filter.data(), nullptr};
    if (posix_spawn(&pid_, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) pid_ = -1;
  }
  ~ChildProcess() {
    if (pid_ > 0 && status_ < 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }
  void kill() { ::kill(pid_, SIGKILL); }
  // Waits for the child to end; its waitpid status.
  int wait() {
    if (status_ < 0 && pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, 0) == pid_) status_ = status;
    }
    return status_;
  }
  // Waits; true when the child exited with code 0.
  bool succeeded() {
    const int status = wait();
    return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

}  // namespace servetune::testing
