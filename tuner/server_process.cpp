// External server processes, the sweep's side (see server_process.h).
#include "tuner/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
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
#include "tuner/process_tree.h"
#include "tuner/server_supervisor.h"

extern char** environ;

namespace servetune::tuner {

ServerProcess::ServerProcess(const std::string& command, const std::map<std::string, std::string>& env,
                             const std::string& log_path, double stop_grace_s)
    : stop_grace_s_(stop_grace_s) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(log_path).parent_path(), ec);
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) throw_io(log_path, std::string("cannot open the server log: ") + std::strerror(errno));
  const std::string header = "$ " + command + "\n";
  (void)!::write(log, header.data(), header.size());
  // Everything the supervisor needs is prepared before fork (it allocates nothing).
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
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    ::close(log);
    throw_io(log_path, std::string("cannot start the server: pipe failed: ") + std::strerror(errno));
  }
  SupervisorArgs args;
  args.sweep = ::getpid();
  args.message_fd = pipe_fds[1];
  args.log_fd = log;
  args.command = command.c_str();
  args.envp = envp.data();
  args.stop_grace_s = stop_grace_s;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    run_supervisor(args);
  }
  ::close(log);
  ::close(pipe_fds[1]);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    throw_io(log_path, std::string("cannot start the server: fork failed: ") + std::strerror(errno));
  }
  supervisor_ = pid;
  messages_ = pipe_fds[0];
  // The first message names the shell; the pipe closes without one when the supervisor could not start it.
  SupervisorMessage m;
  ssize_t got;
  while ((got = ::read(messages_, &m, sizeof(m))) < 0 && errno == EINTR) {
  }
  if (got != static_cast<ssize_t>(sizeof(m)) || m.kind != SupervisorMessage::kShellStarted) {
    stop();
    throw_io(log_path, "cannot start the server: its supervisor exited before starting /bin/sh");
  }
  shell_ = m.value;
  if (auto s = read_process_stat(supervisor_)) supervisor_start_ticks_ = s->start_ticks;
  ::fcntl(messages_, F_SETFL, ::fcntl(messages_, F_GETFL) | O_NONBLOCK);
}

ServerProcess::~ServerProcess() {
  stop();
  if (messages_ >= 0) ::close(messages_);
}

void ServerProcess::read_messages() {
  SupervisorMessage m;
  while (messages_ >= 0 && ::read(messages_, &m, sizeof(m)) == static_cast<ssize_t>(sizeof(m))) {
    if (m.kind == SupervisorMessage::kShellExited && !status_) status_ = m.value;
  }
}

std::optional<int> ServerProcess::poll() {
  read_messages();
  if (status_ || supervisor_ <= 0 || supervisor_reaped_) return status_;
  int st = 0;
  if (::waitpid(supervisor_, &st, WNOHANG) == supervisor_) {
    supervisor_reaped_ = true;
    read_messages();
    if (!status_) status_ = st;  // the supervisor itself was killed: the shell went with it or is orphaned
  }
  return status_;
}

bool ServerProcess::launched(pid_t pid) const {
  if (pid == supervisor_) return true;
  for (pid_t p = pid; p > 1;) {
    const auto s = read_process_stat(p);
    if (!s) return false;
    if (s->ppid == supervisor_) return true;
    p = s->ppid;
  }
  return false;
}

void ServerProcess::stop() {
  if (supervisor_ <= 0) return;
  if (!poll()) stopped_by_us_ = true;
  // A supervisor that died before us (killed from outside) left its tree behind: kill the server's group.
  bool orphaned = supervisor_reaped_;
  if (!supervisor_reaped_) {
    ::kill(supervisor_, SIGTERM);
    // The supervisor gives the tree stop_grace_s, then kills what is left; allow it that and a margin.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(stop_grace_s_ + 5.0);
    int st = 0;
    while (::waitpid(supervisor_, &st, WNOHANG) != supervisor_) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(supervisor_, SIGKILL);
        ::waitpid(supervisor_, &st, 0);
        orphaned = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    supervisor_reaped_ = true;
  }
  if (orphaned && shell_ > 0) ::kill(-shell_, SIGKILL);
  read_messages();
  supervisor_ = -1;
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
