// The sweep's process plumbing without a server: /proc/PID/stat parsing (a comm with spaces and parentheses),
// descendants, who listens on a port, and ServerProcess's supervisor: the shell's exit status, a tree with a
// detached daemon stopped whole, and a supervisor that dies with its parent.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "tuner/process_tree.h"
#include "tuner/server_process.h"

namespace servetune::tuner {
namespace {
namespace fs = std::filesystem;

bool alive(pid_t pid) {
  const auto s = read_process_stat(pid);
  if (!s) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  return text.find(") Z ") == std::string::npos;  // a zombie has exited
}

// The pid of the first process whose command line contains `needle`; 0 when none.
pid_t find_process(const std::string& needle) {
  for (const auto& p : all_process_stats()) {
    std::ifstream in("/proc/" + std::to_string(p.pid) + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char& c : cmd) c = c == '\0' ? ' ' : c;
    if (cmd.find(needle) != std::string::npos && alive(p.pid)) return p.pid;
  }
  return 0;
}

bool wait_for(const std::function<bool()>& done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

fs::path log_path(const std::string& name) {
  return fs::temp_directory_path() / ("servetune_process_tree_" + name + "_" + std::to_string(::getpid()) + ".log");
}

TEST(TunerProcessTree, ParsesStatWithAnAwkwardCommand) {
  const std::string text =
      "4242 (a b) c) (d) S 17 4242 4240 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200 0 0";
  ProcessStat s;
  ASSERT_TRUE(parse_proc_stat(text.data(), text.size(), s));
  EXPECT_EQ(s.pid, 4242);
  EXPECT_EQ(s.ppid, 17);
  EXPECT_EQ(s.pgid, 4242);
  EXPECT_EQ(s.sid, 4240);
  EXPECT_EQ(s.start_ticks, 987654u);
  const std::string cut = "4242 (x) S 17 4242";
  EXPECT_FALSE(parse_proc_stat(cut.data(), cut.size(), s));
  const auto self = read_process_stat(::getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->ppid, ::getppid());
  EXPECT_EQ(self->sid, ::getsid(0));
}

TEST(TunerProcessTree, DescendantsFollowParentChains) {
  const std::vector<ProcessStat> all = {{10, 1, 10, 10, 0}, {11, 10, 10, 10, 0}, {12, 11, 12, 12, 0},
                                        {13, 1, 13, 13, 0}, {14, 12, 12, 12, 0}};
  EXPECT_EQ(descendants_of(10, all), (std::vector<pid_t>{11, 12, 14}));
  EXPECT_TRUE(descendants_of(13, all).empty());
}

TEST(TunerProcessTree, FindsTheListenerOfAPort) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  EXPECT_FALSE(tcp_port_accepts("127.0.0.1", port, 500));  // bound, not listening
  EXPECT_TRUE(tcp_port_listeners(port).empty());
  ASSERT_EQ(::listen(fd, 4), 0);
  EXPECT_TRUE(tcp_port_accepts("127.0.0.1", port, 500));
  EXPECT_EQ(tcp_port_listeners(port), std::vector<pid_t>{::getpid()});
  EXPECT_NE(describe_process(::getpid()).find("pid " + std::to_string(::getpid()) + " ("), std::string::npos);
  ::close(fd);
  EXPECT_FALSE(tcp_port_accepts("127.0.0.1", port, 500));
}

TEST(TunerServerProcess, ReportsTheShellsExitStatus) {
  const fs::path log = log_path("exit");
  ServerProcess p("echo hello; exit 7", {{"SERVETUNE_TEST_VAR", "x"}}, log.string(), 2.0);
  ASSERT_TRUE(wait_for([&] { return p.poll().has_value(); }, 10));
  EXPECT_EQ(describe_wait_status(*p.poll()), "exit status 7");
  p.stop();
  EXPECT_FALSE(p.stopped_by_us());
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("$ echo hello; exit 7\nhello\n"), std::string::npos) << text;
  fs::remove(log);
}

TEST(TunerServerProcess, StopEndsTheWholeTreeDetachedDaemonsIncluded) {
  const fs::path log = log_path("tree");
  // A shell that ignores SIGTERM, a child, and a daemon that left the session: all must go.
  ServerProcess p("trap '' TERM; sleep 301.25 & setsid sh -c 'sleep 301.5' & wait", {}, log.string(), 0.5);
  ASSERT_TRUE(wait_for([] { return find_process("sleep 301.25") != 0 && find_process("sleep 301.5") != 0; }, 10));
  const pid_t daemon = find_process("sleep 301.5");
  EXPECT_TRUE(p.launched(daemon));  // re-parented to the supervisor (a child subreaper)
  EXPECT_TRUE(p.launched(p.shell_pid()));
  EXPECT_FALSE(p.launched(::getpid()));
  EXPECT_FALSE(p.poll().has_value());
  p.stop();
  EXPECT_TRUE(p.stopped_by_us());
  EXPECT_EQ(find_process("sleep 301.25"), 0);
  EXPECT_EQ(find_process("sleep 301.5"), 0);
  fs::remove(log);
}

TEST(TunerServerProcess, TheTreeDiesWithTheProcessThatLaunchedIt) {
  const fs::path log = log_path("orphan");
  const pid_t sweep = ::fork();
  if (sweep == 0) {
    ServerProcess p("sleep 302.75", {}, log.string(), 0.5);
    ::pause();  // killed by the test with SIGKILL: no destructor runs
    ::_exit(0);
  }
  ASSERT_TRUE(wait_for([] { return find_process("sleep 302.75") != 0; }, 10));
  ::kill(sweep, SIGKILL);
  ::waitpid(sweep, nullptr, 0);
  EXPECT_TRUE(wait_for([] { return find_process("sleep 302.75") == 0; }, 5));
  fs::remove(log);
}

}  // namespace
}  // namespace servetune::tuner
