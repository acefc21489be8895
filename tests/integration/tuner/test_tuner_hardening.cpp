// A sweep never measures the wrong server and never leaves one behind, with real processes: a stray server on the
// fixed port (there before the launch, or binding it just after), a wrapper script that keeps running after its
// server died, a server failing a quarter of its requests, a sweep interrupted by SIGINT, SIGTERM and SIGKILL and
// then resumed, and a supervisor killed with its sweep (what --resume reaps). `ps` is checked for leftovers.
// Each test looks for its own processes by a command-line marker no other test uses (sleep 300.733, --itl-us 5003,
// ...): ctest runs them in parallel.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "child_process.h"
#include "loadgen/server_metrics.h"
#include "test_paths.h"
#include "tuner_cli.h"

namespace servetune::testing {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const std::string kMock = SERVETUNE_MOCK_SERVER;

// Each server's keys: the health path, and timeouts short enough for a test.
const std::string kServerKeys = "health: /v1/models\n{indent}startup_timeout_s: 20\n{indent}stop_timeout_s: 2\n";

std::string server_keys(const std::string& indent) {
  std::string s = kServerKeys;
  for (size_t at; (at = s.find("{indent}")) != std::string::npos;) s.replace(at, 8, indent);
  return indent + s;
}

// A sweep of one server (`server` holds its command and keys at target level) or several (`server` holds
// `servers:`, each entry with server_keys("      ")).
std::string sweep_file(const std::string& name, const std::string& server, const std::string& space,
                       const std::string& workload) {
  const bool many = server.find("servers:") != std::string::npos;
  return "name: " + name + "\ntarget:\n  engine: external\n  model: mock-model\n  tokenizer: " + stories_path() +
         "\n" + (many ? "" : server_keys("  ")) + server + space + "workloads:\n  - " + workload + "\n";
}

// A process started with /bin/sh -c, in a group of its own, killed (the group) and reaped by the destructor.
class Background {
 public:
  explicit Background(const std::string& command) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      std::freopen("/dev/null", "w", stdout);
      std::freopen("/dev/null", "w", stderr);
      ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// The mock's pretend-speculation counter: the number of tokens it has streamed ("0": it served nothing; "?": it
// did not answer).
std::string mock_drafts(int port) {
  const auto text = loadgen::http_get("http://127.0.0.1:" + std::to_string(port) + "/metrics", 2000);
  const auto stats = text ? loadgen::parse_spec_decode_counters(*text) : std::nullopt;
  return stats ? std::to_string(stats->num_drafts) : "?";
}

bool wait_until(const std::function<bool()>& done, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::map<std::string, nlohmann::json> markers(const fs::path& run) {
  std::map<std::string, nlohmann::json> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run / "trials", ec)) {
    if (!is_finished_json(e)) continue;
    const auto m = read_json(e.path());
    out[m["candidate"].get<std::string>()] = m;
  }
  return out;
}

// With the server's flush_cache path the tuner POSTs it before every measured run (the mock logs each flush; its
// effect on a cache is TunerSweep.EachRunStartsWithAnEmptyPrefixCache's); flush_prefix_cache: false sends none; a
// path the server does not serve fails the trial, naming it.
TEST(TunerHardening, TheServersPrefixCacheIsFlushedBeforeEachRun) {
  const fs::path dir = scratch("flush");
  const std::string workload = "{name: w, dataset: random, input_len: 16, output_len: 4, num_prompts: 4, max_concurrency: [1, 2]}";
  const auto flushes = [&](const std::string& name, const std::string& keys) {
    write_text(dir / (name + ".yaml"), sweep_file(name, "  command: \"exec " + kMock + " --port {port} --prefix-cache\"\n" + keys, "", workload));
    const CliResult r = servetune("sweep " + (dir / (name + ".yaml")).string() + " --output " + (dir / name).string());
    EXPECT_EQ(r.code, 0) << r.output;
    const std::string log = read_text(dir / name / "raw" / "c0" / "server.main.log");
    size_t n = 0;
    for (size_t at = 0; (at = log.find("flushed the prefix cache", at)) != std::string::npos; ++at) ++n;
    return n;
  };
  EXPECT_EQ(flushes("flushed", "  flush_cache: /flush_cache\n"), 2u);  // one per level
  EXPECT_EQ(flushes("kept", "  flush_cache: /flush_cache\n  flush_prefix_cache: false\n"), 0u);
  write_text(dir / "bad.yaml", sweep_file("bad", "  command: \"exec " + kMock + " --port {port}\"\n  flush_cache: /nope\n", "", workload));
  const CliResult bad = servetune("sweep " + (dir / "bad.yaml").string() + " --output " + (dir / "bad").string());
  EXPECT_EQ(bad.code, 1) << bad.output;  // its only candidate failed
  const auto m = markers(dir / "bad");
  ASSERT_EQ(m.size(), 1u) << bad.output;
  EXPECT_NE(m.begin()->second["reason"].get<std::string>().find("/nope, the server's flush_cache) did not answer 200"),
            std::string::npos) << m.begin()->second.dump();
  fs::remove_all(dir);
}

TEST(TunerHardening, AStrayServerOnTheFixedPortIsNeverMeasured) {
  const fs::path dir = scratch("stray");
  const int port = free_port();
  // There before the launch: the port check names it, and it serves nothing.
  Background stray(kMock + " --port " + std::to_string(port) + " --spec-decode-tokens 1");
  ASSERT_TRUE(wait_until([&] { return mock_drafts(port) == "0"; }, 10));
  write_text(dir / "a.yaml", sweep_file("stray", "  port: " + std::to_string(port) + "\n  command: \"" + kMock +
                                                     " --port {port} {flags}\"\n",
                                        "space: {itl-us: [0, 100]}\n",
                                        "{name: w, dataset: random, input_len: 16, output_len: 20, num_prompts: 4}"));
  const CliResult a = servetune("sweep " + (dir / "a.yaml").string() + " --output " + (dir / "a").string());
  EXPECT_EQ(a.code, 1) << a.output;  // every candidate failed: an error, after the report
  const auto ma = markers(dir / "a");
  ASSERT_EQ(ma.size(), 2u) << a.output;
  for (const auto& [id, m] : ma) {
    EXPECT_EQ(m["failure"], "did_not_start") << m.dump();
    const std::string reason = m["reason"];
    EXPECT_NE(reason.find("already in use by pid"), std::string::npos) << reason;
    EXPECT_NE(reason.find("servetune_mock_openai --port " + std::to_string(port)), std::string::npos) << reason;
  }
  EXPECT_EQ(mock_drafts(port), "0");
  EXPECT_NE(read_text(dir / "a" / "report.md").find("already in use"), std::string::npos);

  // Binding the port just after the launch (the port check passed): the owner check finds it is not ours.
  const int port2 = free_port();
  const fs::path flag = dir / "flag";
  Background late("while [ ! -e " + flag.string() + " ]; do sleep 0.02; done; exec " + kMock + " --port " +
                  std::to_string(port2) + " --spec-decode-tokens 1");
  write_text(dir / "b.yaml", sweep_file("late", "  port: " + std::to_string(port2) + "\n  command: \"touch " +
                                                     flag.string() + "; sleep 30.321\"\n",
                                        "", "{name: w, dataset: random, input_len: 16, output_len: 20, num_prompts: 4}"));
  const CliResult b = servetune("sweep " + (dir / "b.yaml").string() + " --output " + (dir / "b").string());
  EXPECT_EQ(b.code, 1) << b.output;
  const auto mb = markers(dir / "b");
  ASSERT_EQ(mb.size(), 1u) << b.output;
  const nlohmann::json& m = mb.begin()->second;
  EXPECT_EQ(m["failure"], "did_not_start") << m.dump();
  EXPECT_NE(m["reason"].get<std::string>().find("which this candidate did not launch"), std::string::npos) << m.dump();
  EXPECT_EQ(mock_drafts(port2), "0");
  EXPECT_FALSE(process_running("sleep 30.321"));
  fs::remove_all(dir);
}

TEST(TunerHardening, AServerThatDiesUnderAWrapperOrFailsRequestsCannotWin) {
  const fs::path dir = scratch("wrapper");
  // `wrapped` is the fastest but its server is killed 1.5 s in while the wrapper (and a daemon it detached) go on;
  // `flaky` is faster than `ok` but fails every 4th request; `ok` must win.
  const std::string keys = server_keys("      ");
  const std::string servers = R"(  servers:
    wrapped:
      command: ")" + kMock + R"( --port {port} --itl-us 10000 & pid=$!; (sleep 1.5; kill -9 $pid) & wait $pid; setsid sleep 300.612 & sleep 300.611"
)" + keys + R"(    flaky:
      command: ")" + kMock + R"( --port {port} --itl-us 100 --fail-every 4"
)" + keys + R"(    ok:
      command: ")" + kMock + R"( --port {port} --itl-us 1000"
)" + keys;
  write_text(dir / "s.yaml", sweep_file("wrapper", servers, "space: {server: [wrapped, flaky, ok]}\n",
                                        "{name: w, dataset: random, input_len: 16, output_len: 20, num_prompts: 16, "
                                        "max_concurrency: 1}"));
  const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::map<std::string, nlohmann::json> by_server;
  for (const auto& [id, m] : markers(dir / "run")) by_server[m["candidate_info"]["settings"]["server"]] = m;
  ASSERT_EQ(by_server.size(), 3u);
  EXPECT_EQ(by_server["wrapped"]["failure"], "crashed") << by_server["wrapped"].dump();
  EXPECT_NE(by_server["wrapped"]["reason"].get<std::string>().find("stopped answering /v1/models"), std::string::npos);
  EXPECT_EQ(by_server["flaky"]["failure"], "requests_failed") << by_server["flaky"].dump();
  EXPECT_NE(by_server["flaky"]["reason"].get<std::string>().find("4 of 16 requests of w failed (25.0%"), std::string::npos)
      << by_server["flaky"].dump();
  EXPECT_EQ(by_server["ok"]["status"], "ok");
  // The flaky candidate's record is kept (its numbers are in the report) but the winner is `ok`.
  EXPECT_TRUE(fs::exists(dir / "run" / "records" / by_server["flaky"]["candidate"].get<std::string>() / "w.r0.json"));
  const std::string md = read_text(dir / "run" / "report.md");
  const std::string conclusion = md.substr(0, md.find("## Gain per stage"));
  EXPECT_NE(conclusion.find(by_server["ok"]["candidate"].get<std::string>()), std::string::npos) << conclusion;
  EXPECT_NE(md.find("failed (requests_failed)"), std::string::npos) << md;
  EXPECT_NE(md.find("failed (crashed)"), std::string::npos);
  EXPECT_FALSE(process_running("sleep 300.61"));  // the wrapper and the daemon it detached
  // A sweep that allows that failure rate lets the flaky server win.
  write_text(dir / "t.yaml", sweep_file("tolerant", servers + "  max_failed_fraction: 0.3\n",
                                        "space: {server: [flaky, ok]}\n",
                                        "{name: w, dataset: random, input_len: 16, output_len: 20, num_prompts: 16, "
                                        "max_concurrency: 1}"));
  const CliResult t = servetune("sweep " + (dir / "t.yaml").string() + " --output " + (dir / "t").string());
  ASSERT_EQ(t.code, 0) << t.output;
  for (const auto& [id, m] : markers(dir / "t")) EXPECT_EQ(m["status"], "ok") << m.dump();
  fs::remove_all(dir);
}

// The sweep process, started in the background with its output in a file.
pid_t start_sweep(const fs::path& file, const fs::path& run, const std::string& mode, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::freopen(log.c_str(), "a", stdout);
    std::freopen(log.c_str(), "a", stderr);
    const std::string f = file.string(), r = run.string();
    if (mode == "resume") {
      ::execl(SERVETUNE_BIN, SERVETUNE_BIN, "sweep", "--resume", r.c_str(), static_cast<char*>(nullptr));
    } else {
      ::execl(SERVETUNE_BIN, SERVETUNE_BIN, "sweep", f.c_str(), "--output", r.c_str(), static_cast<char*>(nullptr));
    }
    ::_exit(127);
  }
  return pid;
}

// The first launch record of a run folder, once a candidate's server is up (its log shows the mock listening).
std::optional<nlohmann::json> running_launch(const fs::path& run) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run / "launches", ec)) {
    if (is_finished_json(e)) return read_json(e.path());
  }
  return std::nullopt;
}

const std::string kSlowServers = R"(  command: ")" + kMock +
                                 R"( --port {port} --itl-us {itl-us} & setsid sleep 300.733 & wait"
  flags: {itl-us: ""}
)";
// 8 requests one at a time, 40 tokens each at 5 or 7 ms: about 2 s per candidate.
const std::string kSlowWorkload =
    "{name: w, dataset: random, input_len: 16, output_len: 40, num_prompts: 8, max_concurrency: 1}";

TEST(TunerHardening, AnInterruptedSweepLeavesNothingRunningAndResumes) {
  for (const int sig : {SIGINT, SIGTERM, SIGKILL}) {
    SCOPED_TRACE("signal " + std::to_string(sig));
    const fs::path dir = scratch("interrupt" + std::to_string(sig));
    write_text(dir / "s.yaml", sweep_file("interrupt", kSlowServers, "space: {itl-us: [5000, 7000]}\n", kSlowWorkload));
    const fs::path run = dir / "run";
    const pid_t pid = start_sweep(dir / "s.yaml", run, "new", dir / "log");
    ASSERT_TRUE(wait_until([&] { return running_launch(run).has_value(); }, 60)) << read_text(dir / "log");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // mid-benchmark
    ::kill(pid, sig);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const std::string log = read_text(dir / "log");
    if (sig == SIGKILL) {
      EXPECT_TRUE(WIFSIGNALED(status)) << log;
    } else {
      ASSERT_TRUE(WIFEXITED(status)) << log;
      EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << log;
      EXPECT_NE(log.find("servetune sweep --resume"), std::string::npos) << log;
      const auto ms = markers(run);
      ASSERT_EQ(ms.size(), 1u) << log;
      EXPECT_EQ(ms.begin()->second["failure"], "interrupted") << ms.begin()->second.dump();
      EXPECT_TRUE(fs::exists(run / "report.md"));
    }
    // The server, its shell and the daemon it detached are gone (the supervisor stops them within its 2 s grace).
    EXPECT_TRUE(wait_until([&] { return !process_running("sleep 300.733") && !process_running("--itl-us 5000"); }, 10))
        << log;
    // --resume runs the interrupted candidate again and completes the sweep.
    const pid_t resumed = start_sweep(dir / "s.yaml", run, "resume", dir / "log2");
    ::waitpid(resumed, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_text(dir / "log2");
    const auto ms = markers(run);
    EXPECT_EQ(ms.size(), 2u);
    for (const auto& [id, m] : ms) EXPECT_EQ(m["status"], "ok") << m.dump();
    EXPECT_FALSE(fs::exists(run / "launches") && !fs::is_empty(run / "launches"));
    EXPECT_FALSE(process_running("sleep 300.733"));
    fs::remove_all(dir);
  }
}

TEST(TunerHardening, ResumeStopsWhatAKilledSweepAndSupervisorLeft) {
  const fs::path dir = scratch("reap");
  // (A daemon that left the session would not be found once its supervisor is gone: no setsid here.)
  const std::string server = "  command: \"" + kMock + " --port {port} --itl-us {itl-us} & wait\"\n  flags: {itl-us: \"\"}\n";
  write_text(dir / "s.yaml", sweep_file("reap", server, "space: {itl-us: [5003]}\n", kSlowWorkload));
  const fs::path run = dir / "run";
  const pid_t pid = start_sweep(dir / "s.yaml", run, "new", dir / "log");
  std::optional<nlohmann::json> launch;
  ASSERT_TRUE(wait_until([&] { return (launch = running_launch(run)).has_value(); }, 60)) << read_text(dir / "log");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Nobody is left to stop the server: it keeps running, orphaned.
  ::kill((*launch)["supervisor_pid"].get<pid_t>(), SIGKILL);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(process_running("--itl-us 5003")) << "the server did not outlive its supervisor; nothing to reap";
  const CliResult r = servetune("sweep --resume " + run.string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("left running by the interrupted sweep"), std::string::npos) << r.output;
  EXPECT_FALSE(process_running("--itl-us 5003"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace servetune::testing
