// External server processes (see server_process.h).
#include "tuner/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "servetune/error.h"

extern char** environ;

namespace servetune::tuner {

ServerProcess::ServerProcess(const std::string& command, const std::map<std::string, std::string>& env,
                             const std::string& log_path) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(log_path).parent_path(), ec);
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) throw_io(log_path, std::string("cannot open the server log: ") + std::strerror(errno));
  const std::string header = "$ " + command + "\n";
  (void)!::write(log, header.data(), header.size());
  // Everything the child needs is prepared before fork: it only calls async-signal-safe functions.
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (!env.count(key)) env_text.push_back(kv);
  }
  for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log);
    throw_io(log_path, std::string("cannot start the server: fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setsid();
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(log, 1);
    ::dup2(log, 2);
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    ::execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
    ::_exit(127);
  }
  ::close(log);
  pid_ = pid;
}

ServerProcess::~ServerProcess() { stop(5.0); }

std::optional<int> ServerProcess::poll() {
  if (status_ || pid_ <= 0) return status_;
  int st = 0;
  const pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) status_ = st;
  return status_;
}

void ServerProcess::stop(double grace_s) {
  if (pid_ <= 0) return;
  if (!poll()) stopped_by_us_ = true;
  // The group outlives the shell when the server forked workers; signal it either way.
  ::kill(-pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (std::chrono::steady_clock::now() < deadline) {
    poll();
    if (status_ && ::kill(-pid_, 0) != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(-pid_, SIGKILL);
  if (!status_) {
    int st = 0;
    if (::waitpid(pid_, &st, 0) == pid_) status_ = st;
  }
  pid_ = -1;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_io("socket", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw_io("127.0.0.1:0", std::string("cannot find a free port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string tail_lines(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > n) lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : "\n") + l;
  return out;
}

bool log_shows_oom(const std::string& path) {
  static const char* kPatterns[] = {"out of memory", "outofmemoryerror", "std::bad_alloc", "cannot allocate memory",
                                    "cuda_error_out_of_memory", "hipErrorOutOfMemory", "oom-kill", "memoryerror"};
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::transform(line.begin(), line.end(), line.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (const char* p : kPatterns) {
      std::string lower = p;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      if (line.find(lower) != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace servetune::tuner
