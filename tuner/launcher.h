// Launchers start one candidate and hand back a Session to run workloads on; destroying the Session tears the
// candidate down (built-in: the Engine is shut down and freed; external: the server's process group is stopped)
// before the next one starts. Failures are classified: did_not_start, crashed, oom, timed_out.
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

inline constexpr const char* kDidNotStart = "did_not_start";
inline constexpr const char* kCrashed = "crashed";
inline constexpr const char* kOom = "oom";
inline constexpr const char* kTimedOut = "timed_out";

class LaunchFailure : public std::runtime_error {
 public:
  LaunchFailure(std::string kind, const std::string& message, std::string log = "")
      : std::runtime_error(message), kind_(std::move(kind)), log_(std::move(log)) {}
  const std::string& kind() const { return kind_; }
  const std::string& log() const { return log_; }  // the server log, relative to the run folder, if any

 private:
  std::string kind_;
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
  // The server log, relative to the run folder; "" when there is none.
  virtual std::string log() const { return ""; }
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
