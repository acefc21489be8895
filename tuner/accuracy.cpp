// The accuracy guard's baseline and per-candidate measurement (see accuracy.h).
#include "tuner/accuracy.h"

#include <filesystem>
#include <fstream>

#include "loadgen/perplexity.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::tuner {
namespace {

namespace fs = std::filesystem;

fs::path accuracy_dir(const std::string& run_dir) { return fs::path(run_dir) / "accuracy"; }

loadgen::PerplexityResult score_text(Engine& engine, const AccuracySpec& a, const std::string& save, const std::string& base) {
  const std::string text = loadgen::perplexity_text(a.dataset, a.num_texts, a.seed, engine.tokenizer());
  loadgen::PerplexityOptions o;
  o.ctx = a.ctx;
  o.chunks = a.chunks;
  o.save_logprobs = save;
  o.kl_base = base;
  return loadgen::measure_perplexity(engine, engine.tokenizer().encode(text, true), o);
}

}  // namespace

void check_accuracy_text(const SweepSpec& spec) {
  const std::string& d = spec.accuracy->dataset;
  std::error_code ec;
  if (d == "sharegpt" || fs::is_regular_file(d, ec)) return;
  throw_usage(spec.source + ": accuracy.dataset: no such file '" + d + "' (a text file, a ShareGPT .json, or sharegpt; relative "
              "to the directory servetune runs in)");
}

double ensure_accuracy_baseline(const SweepSpec& spec, const SearchSpace& space, const std::string& run_dir) {
  const fs::path dir = accuracy_dir(run_dir);
  const fs::path done = dir / "baseline.json";
  if (fs::exists(done)) {
    std::ifstream in(done);
    return nlohmann::json::parse(in).at("perplexity").get<double>();
  }
  fs::create_directories(dir);
  const Candidate baseline = space.baseline();
  Engine engine(space.engine_config(baseline));
  const auto r = score_text(engine, *spec.accuracy, (dir / "baseline.logprobs").string(), "");
  nlohmann::ordered_json j;
  j["candidate"] = baseline.label;
  j["settings"] = space.full_settings(baseline);
  j["perplexity"] = r.ppl;
  j["perplexity_error"] = r.ppl_error;
  j["scored_tokens"] = r.scored;
  std::ofstream(done) << j.dump(2) << "\n";  // last: its presence says the log-probabilities are complete
  return r.ppl;
}

nlohmann::ordered_json measure_accuracy(Engine& engine, const SweepSpec& spec, const std::string& run_dir, double baseline_ppl) {
  const auto r = score_text(engine, *spec.accuracy, "", (accuracy_dir(run_dir) / "baseline.logprobs").string());
  nlohmann::ordered_json m;
  m["perplexity"] = r.ppl;
  m["perplexity_increase"] = (r.ppl - baseline_ppl) / baseline_ppl;
  m["kl_vs_baseline"] = r.kl->mean;
  m["kl_p99_vs_baseline"] = r.kl->p99;
  m["top1_agreement_vs_baseline"] = r.kl->top1_agreement;
  return m;
}

}  // namespace servetune::tuner
