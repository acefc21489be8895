// The accuracy guard's baseline and per-candidate measurement (see accuracy.h).
#include "tuner/accuracy.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "loadgen/perplexity.h"
#include "loadgen/perplexity_server.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"
#include "tuner/results_store.h"

namespace servetune::tuner {
namespace {

namespace fs = std::filesystem;

fs::path accuracy_dir(const std::string& run_dir) { return fs::path(run_dir) / "accuracy"; }

// Held while the baseline is computed: the trials of a parallel sweep (--parallel, Slurm jobs) may all need it at
// once; one computes it, the others wait and read it.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) : fd_(::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw Error(ErrorKind::kIo, "cannot open " + path.string() + " to lock it");
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

loadgen::PerplexityOptions perplexity_options(const AccuracySpec& a, const std::string& save, const std::string& base) {
  loadgen::PerplexityOptions o;
  o.ctx = a.ctx;
  o.chunks = a.chunks;
  o.save_logprobs = save;
  o.kl_base = base;
  return o;
}

// The accuracy text scored by the session's engine (built-in) or its server (external), tokenized by the engine's
// tokenizer or `tokenizer`.
loadgen::PerplexityResult score_text(Session& session, const Tokenizer& tokenizer, const AccuracySpec& a, const std::string& save,
                                     const std::string& base) {
  const loadgen::PerplexityOptions o = perplexity_options(a, save, base);
  if (Engine* engine = session.engine()) {
    const std::string text = loadgen::perplexity_text(a.dataset, a.num_texts, a.seed, engine->tokenizer());
    return loadgen::measure_perplexity(*engine, engine->tokenizer().encode(text, true), o);
  }
  loadgen::ServerEndpoint server;
  server.url = session.base_url();
  server.model = session.served_model();
  server.api_key = session.api_key();
  server.top_logprobs = a.prompt_logprobs;
  const std::string text = loadgen::perplexity_text(a.dataset, a.num_texts, a.seed, tokenizer);
  const auto chunks = loadgen::perplexity_chunks(tokenizer.encode(text, true), a.ctx, a.chunks,
                                                 tokenizer.add_bos() ? tokenizer.bos_id() : -1);
  const auto scorer = loadgen::make_server_scorer(server, tokenizer.vocab_size());
  return loadgen::measure_perplexity(*scorer, chunks, o);
}

// The built-in baseline's engine, as a Session so it is scored as a candidate is.
class EngineOnly : public Session {
 public:
  explicit EngineOnly(const EngineConfig& config) : engine_(config) {}
  loadgen::Client& client() override { throw Error(ErrorKind::kInternal, "the accuracy baseline has no benchmark client"); }
  Engine* engine() override { return &engine_; }

 private:
  Engine engine_;
};

}  // namespace

void check_accuracy_text(const SweepSpec& spec) {
  const std::string& d = spec.accuracy->dataset;
  std::error_code ec;
  if (d == "sharegpt" || fs::is_regular_file(d, ec)) return;
  throw_usage(spec.source + ": accuracy.dataset: no such file '" + d + "' (a text file, a ShareGPT .json, or sharegpt; relative "
              "to the directory servetune runs in)");
}

double ensure_accuracy_baseline(const SweepSpec& spec, const SearchSpace& space, const std::string& run_dir, Launcher& launcher,
                                const Tokenizer& tokenizer) {
  const fs::path dir = accuracy_dir(run_dir);
  const fs::path done = dir / "baseline.json";
  fs::create_directories(dir);
  const FileLock lock(dir / "baseline.lock");
  if (fs::exists(done)) {
    std::ifstream in(done);
    return nlohmann::json::parse(in).at("perplexity").get<double>();
  }
  const Candidate baseline = space.baseline();
  std::unique_ptr<Session> session;
  if (spec.builtin()) {
    session = std::make_unique<EngineOnly>(space.engine_config(baseline));
  } else {
    try {
      session = launcher.start(baseline, run_dir, "accuracy");
    } catch (const LaunchFailure& f) {
      if (f.kind() == TrialFailure::kInterrupted) throw;
      throw Error(ErrorKind::kUnsupported, "the accuracy baseline, candidate " + baseline.id + " (" + baseline.label +
                                               "), did not come up, so no candidate can be compared: " + f.what());
    }
  }
  const auto r = score_text(*session, tokenizer, *spec.accuracy, (dir / "baseline.logprobs").string(), "");
  nlohmann::ordered_json j;
  j["candidate"] = baseline.label;
  j["settings"] = space.full_settings(baseline);
  if (!spec.builtin()) j["prompt_logprobs"] = spec.accuracy->prompt_logprobs;
  j["perplexity"] = r.ppl;
  j["perplexity_error"] = r.ppl_error;
  j["scored_tokens"] = r.scored;
  write_file_atomic(done.string(), j.dump(2) + "\n");  // last: its presence says the log-probabilities are complete
  return r.ppl;
}

nlohmann::ordered_json measure_accuracy(Session& session, const Tokenizer& tokenizer, const SweepSpec& spec,
                                        const std::string& run_dir, double baseline_ppl) {
  const auto r = score_text(session, tokenizer, *spec.accuracy, "", (accuracy_dir(run_dir) / "baseline.logprobs").string());
  nlohmann::ordered_json m;
  m["perplexity"] = r.ppl;
  m["perplexity_increase"] = (r.ppl - baseline_ppl) / baseline_ppl;
  m["kl_vs_baseline"] = r.kl->mean;
  m["kl_p99_vs_baseline"] = r.kl->p99;
  m["top1_agreement_vs_baseline"] = r.kl->top1_agreement;
  return m;
}

}  // namespace servetune::tuner
