// servetune_mock_openai (loadgen/mock) run for a test on a free port: started with extra flags, its port read
// from its "listening on" line, stopped (SIGTERM) and reaped when the object goes. Needs SERVETUNE_MOCK_SERVER.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace servetune::testing {

class MockServer {
 public:
  explicit MockServer(std::vector<std::string> extra = {}) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    std::vector<std::string> args = {SERVETUNE_MOCK_SERVER, "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) throw std::runtime_error("spawn");
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    FILE* out = fdopen(fds[0], "r");
    char line[256] = {};
    if (std::fgets(line, sizeof(line), out) == nullptr) throw std::runtime_error("mock server did not start");
    std::fclose(out);
    const std::string s = line;
    port_ = std::stoi(s.substr(s.rfind(':') + 1));
  }
  ~MockServer() {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  MockServer(const MockServer&) = delete;
  MockServer& operator=(const MockServer&) = delete;

  int port() const { return port_; }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
};

}  // namespace servetune::testing
