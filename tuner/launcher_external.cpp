// External launcher: renders the candidate's command, starts it in its own process group with its log in
// raw/<candidate>/, polls the health endpoint until it answers 200 (or the process exits, or the startup timeout
// passes), and benchmarks it over HTTP. Teardown stops the whole group.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "loadgen/backends.h"
#include "loadgen/http_client.h"
#include "loadgen/server_metrics.h"
#include "servetune/error.h"
#include "tuner/launcher.h"
#include "tuner/server_command.h"
#include "tuner/server_process.h"

namespace servetune::tuner {
namespace {

class ExternalSession : public Session {
 public:
  ExternalSession(const SweepSpec& spec, const ServerSpec& server, const LaunchCommand& cmd, int port,
                  const std::string& log_path, const std::string& log_rel)
      : server_(server), command_(cmd.command), log_path_(log_path), log_rel_(log_rel) {
    process_ = std::make_unique<ServerProcess>(cmd.command, server.env, log_path);
    const std::string base = "http://" + spec.target.host + ":" + std::to_string(port);
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      if (const auto st = process_->poll()) {
        const std::string tail = tail_lines(log_path, 5);
        throw LaunchFailure(log_shows_oom(log_path) ? TrialFailure::kOom : TrialFailure::kDidNotStart,
                            "the server exited (" + describe_wait_status(*st) + ") before " + server.health +
                                " answered" + (tail.empty() ? "" : "; its log ends:\n" + tail),
                            log_rel);
      }
      if (loadgen::http_get(base + server.health, 2000)) break;  // HTTP 200
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > server.startup_timeout_s) {
        process_->stop(server.stop_timeout_s);
        throw LaunchFailure(TrialFailure::kTimedOut,
                            server.health + " did not answer 200 within startup_timeout_s = " +
                                std::to_string(static_cast<int>(server.startup_timeout_s)) + " s",
                            log_rel);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    loadgen::HttpClientOptions h;
    h.backend = server.backend;
    h.api_url = base + (server.endpoint.empty() ? loadgen::default_endpoint(server.backend) : server.endpoint);
    h.model = server.served_model_name.empty() ? spec.target.model : server.served_model_name;
    if (const char* k = std::getenv("OPENAI_API_KEY")) h.api_key = k;
    api_key_ = h.api_key;
    metrics_url_ = base + "/metrics";
    h.request_timeout_s = server.request_timeout_s;
    client_ = std::make_unique<loadgen::HttpClient>(h);
  }

  ~ExternalSession() override {
    client_.reset();
    process_->stop(server_.stop_timeout_s);
  }

  loadgen::Client& client() override { return *client_; }
  std::string command() const override { return command_; }
  std::string metrics_url() const override { return metrics_url_; }
  std::string api_key() const override { return api_key_; }
  std::string log() const override { return log_rel_; }

  void check_alive(double grace_s) override {
    auto st = process_->poll();
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    while (!st && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      st = process_->poll();
    }
    if (!st) return;
    const bool oom = log_shows_oom(log_path_) || (WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL);
    const std::string tail = tail_lines(log_path_, 5);
    throw LaunchFailure(oom ? TrialFailure::kOom : TrialFailure::kCrashed,
                        "the server died during the benchmark (" + describe_wait_status(*st) + ")" +
                            (tail.empty() ? "" : "; its log ends:\n" + tail),
                        log_rel_);
  }

 private:
  const ServerSpec& server_;
  std::string command_;
  std::string log_path_;
  std::string log_rel_;
  std::string metrics_url_;
  std::string api_key_;
  std::unique_ptr<ServerProcess> process_;
  std::unique_ptr<loadgen::HttpClient> client_;
};

class ExternalLauncher : public Launcher {
 public:
  ExternalLauncher(const SweepSpec& spec, const SearchSpace& space) : spec_(spec), space_(space) {}

  std::unique_ptr<Session> start(const Candidate& candidate, const std::string& run_dir, const std::string& tag) override {
    const int port = spec_.target.port == 0 ? free_port() : spec_.target.port;
    std::string why;
    const auto cmd = render_launch(spec_, space_.full_settings(candidate), port, why);
    if (!cmd) throw LaunchFailure(TrialFailure::kDidNotStart, why);
    const std::string rel = "raw/" + candidate.id + "/server." + tag + ".log";
    const std::string path = (std::filesystem::path(run_dir) / rel).string();
    std::error_code ec;
    std::filesystem::remove(path, ec);  // a re-run after --resume starts a fresh log
    return std::make_unique<ExternalSession>(spec_, *cmd->server, *cmd, port, path, rel);
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
