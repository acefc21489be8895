// The accuracy guard of a sweep (`accuracy:` in the sweep file): every candidate's teacher-forced perplexity on a
// fixed text and its KL divergence against the sweep's baseline candidate, as metrics of each of its records, so
// `slo` bounds them (kl_vs_baseline, perplexity_increase) and a faster but less accurate candidate cannot win.
// Built-in candidates are scored on the engine's whole logits rows; external servers through /v1/completions with
// vLLM's prompt_logprobs (accuracy.prompt_logprobs = K; the KL is the top-K form of loadgen/position_logprobs.h).
// The baseline is the space's baseline candidate on the same target: an external one is launched on its own, once.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "tuner/launcher.h"
#include "tuner/space.h"
#include "tuner/sweep_spec.h"

namespace servetune {
class Tokenizer;
}

namespace servetune::tuner {

// Throws Error(kUsage) naming the sweep file when accuracy.dataset is not a readable file (relative paths are from the
// directory the sweep runs in, as for the workloads' files).
void check_accuracy_text(const SweepSpec& spec);

// The baseline candidate's log-probabilities on the accuracy text, in RUN/accuracy/ (written once; a resumed sweep
// reuses them). Built-in: an engine of its settings in this process; external: its server, started through
// `launcher` (tag "accuracy", log in raw/<candidate>/) and stopped once scored. Returns its perplexity. Throws Error
// as measure_perplexity does, and Error(kUnsupported) when the baseline's server does not come up: without a
// baseline no candidate can be compared, so the sweep stops. `tokenizer` makes an external target's prompts.
double ensure_accuracy_baseline(const SweepSpec& spec, const SearchSpace& space, const std::string& run_dir, Launcher& launcher,
                                const Tokenizer& tokenizer);

// The accuracy metrics of the candidate `session` runs, against the baseline: perplexity, perplexity_increase
// (relative to the baseline's), kl_vs_baseline (mean nats), kl_p99_vs_baseline, top1_agreement_vs_baseline.
nlohmann::ordered_json measure_accuracy(Session& session, const Tokenizer& tokenizer, const SweepSpec& spec,
                                        const std::string& run_dir, double baseline_ppl);

}  // namespace servetune::tuner
