// Launchers start one candidate and hand back a Session to run workloads on; destroying the Session tears the
// candidate down (built-in: the Engine is shut down and freed; external: the server's process group is stopped)
// before the next one starts. Failures are classified (TrialFailure), where they are seen.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "loadgen/client.h"
#include "tuner/space.h"
#include "tuner/sweep_spec.h"

namespace servetune {
class Engine;
class Tokenizer;
}  // namespace servetune

namespace servetune::tuner {

// Why a candidate failed; trial markers and reports spell it as trial_failure_name() gives.
enum class TrialFailure {
  kNone,
  kDidNotStart,     // did_not_start: the launch command failed or the server exited before it was healthy
  kCrashed,         // crashed: the server or engine process died
  kOom,             // oom: out of memory (the server's log says so, or the kernel's OOM killer struck)
  kTimedOut,        // timed_out: startup, a request or the whole trial ran past its timeout
  kRequestsFailed,  // requests_failed: the candidate ran, but more of a run's requests failed than target.max_failed_fraction
  kInterrupted,     // interrupted: the sweep was interrupted (SIGINT/SIGTERM/SIGHUP) during the trial; --resume re-runs it
};
constexpr const char* trial_failure_name(TrialFailure failure) {  // "" for kNone
  switch (failure) {
    case TrialFailure::kNone: return "";
    case TrialFailure::kDidNotStart: return "did_not_start";
    case TrialFailure::kCrashed: return "crashed";
    case TrialFailure::kOom: return "oom";
    case TrialFailure::kTimedOut: return "timed_out";
    case TrialFailure::kRequestsFailed: return "requests_failed";
    case TrialFailure::kInterrupted: return "interrupted";
  }
  return "";
}

class LaunchFailure : public std::runtime_error {
 public:
  LaunchFailure(TrialFailure kind, const std::string& message, std::string log = "")
      : std::runtime_error(message), kind_(kind), log_(std::move(log)) {}
  TrialFailure kind() const { return kind_; }
  const std::string& log() const { return log_; }  // the server log, relative to the run folder, if any

 private:
  TrialFailure kind_;
  std::string log_;
};

class Session {
 public:
  virtual ~Session() = default;
  virtual loadgen::Client& client() = 0;
  // The built-in engine (for its tokenizer and step statistics); nullptr for an external server.
  virtual Engine* engine() { return nullptr; }
  // Throws LaunchFailure (crashed / oom) when the server has died, waiting up to `grace_s` for a server that is
  // going down (requests fail a moment before the process exits).
  virtual void check_alive(double grace_s = 0.0) { (void)grace_s; }
  // The launch command (external) or "" (built-in).
  virtual std::string command() const { return ""; }
  // The server's Prometheus endpoint and the bearer key the client sends (external), or "" (built-in).
  virtual std::string metrics_url() const { return ""; }
  virtual std::string api_key() const { return ""; }
  // The server's base URL (http://host:port) and the "model" name its client sends (external), or "" (built-in):
  // the accuracy guard scores the server through /v1/completions.
  virtual std::string base_url() const { return ""; }
  virtual std::string served_model() const { return ""; }
  // The server log, relative to the run folder; "" when there is none.
  virtual std::string log() const { return ""; }
  // Empties the prefix cache (the built-in engine's, or through the server's flush_cache path); false when the
  // server has none configured. Throws LaunchFailure when the server refuses it.
  virtual bool flush_cache() { return false; }
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Throws LaunchFailure when the candidate cannot be brought up.
  virtual std::unique_ptr<Session> start(const Candidate& candidate, const std::string& run_dir, const std::string& tag) = 0;

  static std::unique_ptr<Launcher> make(const SweepSpec& spec, const SearchSpace& space);
};

std::unique_ptr<Launcher> make_builtin_launcher(const SweepSpec& spec, const SearchSpace& space);
std::unique_ptr<Launcher> make_external_launcher(const SweepSpec& spec, const SearchSpace& space);

}  // namespace servetune::tuner
