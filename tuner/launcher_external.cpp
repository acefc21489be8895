// External launcher: renders the candidate's command, makes sure its port is not already served by someone else,
// starts it under a supervisor (server_process.h) with its log in raw/<candidate>/, polls the health endpoint until
// it answers 200 (or the process exits, or the startup timeout passes), checks that the process answering is the
// one launched, and benchmarks it over HTTP while a monitor polls its health. Teardown stops the whole tree.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "loadgen/backends.h"
#include "loadgen/http_client.h"
#include "loadgen/http_request.h"
#include "servetune/error.h"
#include "tuner/interrupt.h"
#include "tuner/launch_records.h"
#include "tuner/launcher.h"
#include "tuner/process_tree.h"
#include "tuner/server_command.h"
#include "tuner/server_process.h"

namespace servetune::tuner {
namespace {

constexpr long kHealthTimeoutMs = 2000;

// Hosts whose listening sockets are this machine's, so /proc can say who owns them.
bool local_host(const std::string& host) {
  return host == "localhost" || host == "0.0.0.0" || host == "::" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string listeners_text(int port) {
  std::string out;
  for (pid_t p : tcp_port_listeners(port)) out += (out.empty() ? "" : ", ") + describe_process(p);
  return out.empty() ? "a process this user cannot see (another user's, or in another network namespace)" : out;
}

// Polls the health path once a second while a workload runs; remembers the failures.
class HealthMonitor {
 public:
  explicit HealthMonitor(std::string url) : url_(std::move(url)), t0_(std::chrono::steady_clock::now()) {
    thread_ = std::thread([this] { loop(); });
  }
  ~HealthMonitor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  int failures() const { return failures_; }
  double first_failure_s() const { return first_failure_s_; }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; })) {
      lock.unlock();
      const bool ok = loadgen::http_get(url_, kHealthTimeoutMs).has_value();
      lock.lock();
      if (!ok && !stop_) {
        if (failures_++ == 0) first_failure_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      }
    }
  }

  std::string url_;
  std::chrono::steady_clock::time_point t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int> failures_{0};
  std::atomic<double> first_failure_s_{0.0};
  std::thread thread_;
};

// Undoes what a launch registered (the interrupt target, the launch record) once its server is stopped: declared
// before the ServerProcess member, so it runs after it, also when the constructor throws.
struct LaunchRegistration {
  std::string run_dir;
  std::string name;
  ~LaunchRegistration() {
    set_interrupt_target(0);
    if (!name.empty()) remove_launch_record(run_dir, name);
  }
};

class ExternalSession : public Session {
 public:
  ExternalSession(const SweepSpec& spec, const ServerSpec& server, const LaunchCommand& cmd, int port,
                  const std::string& run_dir, const std::string& record_name, const std::string& candidate,
                  const std::string& log_path, const std::string& log_rel)
      : server_(server), command_(cmd.command), log_path_(log_path), log_rel_(log_rel) {
    process_ = std::make_unique<ServerProcess>(cmd.command, server.env, log_path, server.stop_timeout_s);
    set_interrupt_target(process_->supervisor_pid());
    registration_.run_dir = run_dir;
    registration_.name = record_name;
    write_launch_record(run_dir, record_name, candidate, *process_);
    const std::string base = "http://" + spec.target.host + ":" + std::to_string(port);
    health_url_ = base + server.health;
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      if (const auto st = process_->poll()) {
        const std::string tail = tail_lines(log_path, 5);
        throw LaunchFailure(log_shows_oom(log_path) ? TrialFailure::kOom : TrialFailure::kDidNotStart,
                            "the server exited (" + describe_wait_status(*st) + ") before " + server.health +
                                " answered" + (tail.empty() ? "" : "; its log ends:\n" + tail),
                            log_rel);
      }
      if (loadgen::http_get(health_url_, kHealthTimeoutMs)) break;  // HTTP 200
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > server.startup_timeout_s) {
        throw LaunchFailure(TrialFailure::kTimedOut,
                            server.health + " did not answer 200 within startup_timeout_s = " +
                                std::to_string(static_cast<int>(server.startup_timeout_s)) + " s",
                            log_rel);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    if (local_host(spec.target.host)) check_owner(port);
    loadgen::HttpClientOptions h;
    h.backend = server.backend;
    h.api_url = base + (server.endpoint.empty() ? loadgen::default_endpoint(server.backend) : server.endpoint);
    h.model = server.served_model_name.empty() ? spec.target.model : server.served_model_name;
    base_url_ = base;
    served_model_ = h.model;
    if (const char* k = std::getenv("OPENAI_API_KEY")) h.api_key = k;
    api_key_ = h.api_key;
    metrics_url_ = base + "/metrics";
    if (!server.flush_cache.empty()) flush_url_ = base + server.flush_cache;
    h.request_timeout_s = server.request_timeout_s;
    client_ = std::make_unique<loadgen::HttpClient>(h);
    monitor_ = std::make_unique<HealthMonitor>(health_url_);
  }

  ~ExternalSession() override {
    monitor_.reset();
    client_.reset();
    process_->stop();
  }

  loadgen::Client& client() override { return *client_; }
  std::string command() const override { return command_; }
  std::string metrics_url() const override { return metrics_url_; }
  std::string api_key() const override { return api_key_; }
  std::string base_url() const override { return base_url_; }
  std::string served_model() const override { return served_model_; }
  std::string log() const override { return log_rel_; }
  bool flush_cache() override {
    if (flush_url_.empty()) return false;
    if (!loadgen::http_post(flush_url_, 60'000, api_key_)) {
      throw LaunchFailure(TrialFailure::kRequestsFailed, "the prefix-cache flush (POST " + flush_url_ +
                                                             ", the server's flush_cache) did not answer 200");
    }
    return true;
  }

  void check_alive(double grace_s) override {
    auto st = process_->poll();
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    while (!st && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      st = process_->poll();
    }
    const std::string tail = tail_lines(log_path_, 5);
    const std::string log_end = tail.empty() ? "" : "; its log ends:\n" + tail;
    if (st) {
      const bool oom = log_shows_oom(log_path_) || (WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL);
      throw LaunchFailure(oom ? TrialFailure::kOom : TrialFailure::kCrashed,
                          "the server died during the benchmark (" + describe_wait_status(*st) + ")" + log_end, log_rel_);
    }
    // The launch command still runs, but that proves nothing when it is a wrapper: the server must still answer.
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (loadgen::http_get(health_url_, kHealthTimeoutMs)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    std::string during;
    if (monitor_ && monitor_->failures() > 0) {
      char buf[120];
      std::snprintf(buf, sizeof(buf), " (%d health checks failed during the run, the first %.1f s after it started)",
                    monitor_->failures(), monitor_->first_failure_s());
      during = buf;
    }
    throw LaunchFailure(log_shows_oom(log_path_) ? TrialFailure::kOom : TrialFailure::kCrashed,
                        "the server stopped answering " + server_.health + during + " while its launch command (" +
                            describe_process(process_->shell_pid()) + ") still runs" + log_end,
                        log_rel_);
  }

 private:
  // The process listening on the port must be one this launch started, or one that started after it (a container
  // runtime's proxy); a listener older than the launch is another server that took the port meanwhile.
  void check_owner(int port) {
    const auto launch = read_process_stat(process_->supervisor_pid());
    if (!launch) return;
    std::string strays;
    for (pid_t p : tcp_port_listeners(port)) {
      if (process_->launched(p)) return;
      const auto s = read_process_stat(p);
      if (s && s->start_ticks < launch->start_ticks) strays += (strays.empty() ? "" : ", ") + describe_process(p);
    }
    if (strays.empty()) return;
    throw LaunchFailure(TrialFailure::kDidNotStart,
                        "port " + std::to_string(port) + " is answered by " + strays +
                            ", which this candidate did not launch (it ran before the launch): its numbers would be "
                            "another server's",
                        log_rel_);
  }

  const ServerSpec& server_;
  std::string command_;
  std::string log_path_;
  std::string log_rel_;
  std::string health_url_;
  std::string metrics_url_;
  std::string flush_url_;  // "" without the server's flush_cache path
  std::string api_key_;
  std::string base_url_;
  std::string served_model_;
  LaunchRegistration registration_;
  std::unique_ptr<ServerProcess> process_;
  std::unique_ptr<loadgen::HttpClient> client_;
  std::unique_ptr<HealthMonitor> monitor_;
};

class ExternalLauncher : public Launcher {
 public:
  ExternalLauncher(const SweepSpec& spec, const SearchSpace& space) : spec_(spec), space_(space) {}

  std::unique_ptr<Session> start(const Candidate& candidate, const std::string& run_dir, const std::string& tag) override {
    const int port = spec_.target.port == 0 ? free_port() : spec_.target.port;
    std::string why;
    const auto cmd = render_launch(spec_, space_.full_settings(candidate), port, why);
    if (!cmd) throw LaunchFailure(TrialFailure::kDidNotStart, why);
    if (spec_.target.port != 0 && tcp_port_accepts(spec_.target.host, port, 1000)) {
      throw LaunchFailure(TrialFailure::kDidNotStart,
                          "target.port " + std::to_string(port) + " on " + spec_.target.host +
                              " is already in use" + (local_host(spec_.target.host) ? " by " + listeners_text(port) : "") +
                              ", before the candidate was launched: its numbers would be that server's; stop it, or "
                              "set target.port to 0 (a free port per launch)");
    }
    const std::string rel = "raw/" + candidate.id + "/server." + tag + ".log";
    const std::string path = (std::filesystem::path(run_dir) / rel).string();
    std::error_code ec;
    std::filesystem::remove(path, ec);  // a re-run after --resume starts a fresh log
    return std::make_unique<ExternalSession>(spec_, *cmd->server, *cmd, port, run_dir, candidate.id + "." + tag,
                                             candidate.id, path, rel);
  }

 private:
  const SweepSpec& spec_;
  const SearchSpace& space_;
};

}  // namespace

std::unique_ptr<Launcher> make_external_launcher(const SweepSpec& spec, const SearchSpace& space) {
  return std::make_unique<ExternalLauncher>(spec, space);
}

}  // namespace servetune::tuner
