// Multi-process test plumbing: a free localhost port, and this test binary re-run as a child process that runs one
// named test case (the case reads its instructions from an environment variable the parent sets).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

extern char** environ;

namespace servetune::testing {

// A port that was free a moment ago (the OS may hand it out again; good enough on a test machine).
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
