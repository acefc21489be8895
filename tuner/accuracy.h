// The accuracy guard of a sweep (`accuracy:` in the sweep file): every built-in candidate's teacher-forced
// perplexity on a fixed text and its KL divergence against the sweep's baseline candidate, as metrics of each of its
// records, so `slo` bounds them (kl_vs_baseline, perplexity_increase) and a faster but less accurate candidate cannot
// win.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "tuner/space.h"
#include "tuner/sweep_spec.h"

namespace servetune {
class Engine;
}

namespace servetune::tuner {

// Throws Error(kUsage) naming the sweep file when accuracy.dataset is not a readable file (relative paths are from the
// directory the sweep runs in, as for the workloads' files).
void check_accuracy_text(const SweepSpec& spec);

// The baseline candidate's log-probabilities on the accuracy text, in RUN/accuracy/ (written once; a resumed sweep
// reuses them). Returns its perplexity. Throws Error as measure_perplexity does.
double ensure_accuracy_baseline(const SweepSpec& spec, const SearchSpace& space, const std::string& run_dir);

// `engine`'s accuracy metrics against the baseline: perplexity, perplexity_increase (relative to the baseline's),
// kl_vs_baseline (mean nats), kl_p99_vs_baseline, top1_agreement_vs_baseline.
nlohmann::ordered_json measure_accuracy(Engine& engine, const SweepSpec& spec, const std::string& run_dir, double baseline_ppl);

}  // namespace servetune::tuner
