// Built-in launcher: a fresh in-process Engine per candidate, shut down and freed when the Session goes.
#include <new>

#include "loadgen/inprocess_client.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "tuner/launcher.h"

namespace servetune::tuner {
namespace {

class BuiltinSession : public Session {
 public:
  explicit BuiltinSession(const EngineConfig& config) : engine_(std::make_unique<Engine>(config)), client_(*engine_) {}
  ~BuiltinSession() override { engine_->shutdown(); }
  loadgen::Client& client() override { return client_; }
  Engine* engine() override { return engine_.get(); }
  bool flush_cache() override {
    engine_->flush_prefix_cache();
    return true;
  }

 private:
  std::unique_ptr<Engine> engine_;
  loadgen::InProcessClient client_;
};

class BuiltinLauncher : public Launcher {
 public:
  BuiltinLauncher(const SweepSpec& spec, const SearchSpace& space) : spec_(spec), space_(space) {}

  std::unique_ptr<Session> start(const Candidate& candidate, const std::string&, const std::string&) override {
    const EngineConfig config = space_.engine_config(candidate);
    try {
      return std::make_unique<BuiltinSession>(config);
    } catch (const std::bad_alloc&) {
      throw LaunchFailure(TrialFailure::kOom, "the engine ran out of memory while loading " + spec_.target.model);
    } catch (const Error& e) {
      throw LaunchFailure(TrialFailure::kDidNotStart, e.what());
    }
  }

 private:
  const SweepSpec& spec_;
  const SearchSpace& space_;
};

}  // namespace

std::unique_ptr<Launcher> make_builtin_launcher(const SweepSpec& spec, const SearchSpace& space) {
  return std::make_unique<BuiltinLauncher>(spec, space);
}

std::unique_ptr<Launcher> Launcher::make(const SweepSpec& spec, const SearchSpace& space) {
  return spec.builtin() ? make_builtin_launcher(spec, space) : make_external_launcher(spec, space);
}

}  // namespace servetune::tuner
