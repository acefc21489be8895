// One measured run of one workload on a launched candidate, through the load generator's library (the same
// arrivals, client, metrics and result keys as `servetune bench`): warm-ups, the timed run, vLLM's metrics, and
// for the built-in engine the engine's step statistics and the process CPU time over the measured run.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/dataset.h"
#include "loadgen/client.h"
#include "tuner/sweep_spec.h"

#include "loadgen/report.h"

namespace servetune {
class Engine;
class Tokenizer;
struct EngineStats;
}  // namespace servetune

namespace servetune::tuner {

struct RunOutput {
  nlohmann::ordered_json metrics;      // vLLM's result keys (without per-request arrays) + servetune's additions
  nlohmann::ordered_json per_request;  // the per-request arrays (for raw/)
  int64_t completed = 0;
  int64_t failed = 0;
  std::string first_error;
};

// `engine` is the built-in engine behind `client` (nullptr for HTTP); `tokenizer` counts generated tokens when a
// server reports no usage.
RunOutput run_workload(loadgen::Client& client, const datasets::Workload& workload, const WorkloadSpec& spec,
                       const std::vector<double>& percentiles, const Tokenizer& tokenizer, Engine* engine);

// The built-in engine's counters over a measured run (after minus before) as engine_* keys of `m`: steps, batch
// sizes, prompt/generation tokens, preemptions, prefix-cache hit tokens and rate, forward-pass and collective
// (tensor-parallel communication) seconds.
void add_engine_deltas(nlohmann::ordered_json& m, const EngineStats& a, const EngineStats& b);

// User + system CPU seconds this process has used so far.
double process_cpu_s();

// The speculative-decoding counters of a measured run on the built-in engine (after minus before), or nullopt
// when the engine does not speculate.
std::optional<loadgen::SpecDecodeStats> spec_decode_delta(const Engine& engine, const EngineStats& before,
                                                          const EngineStats& after);

}  // namespace servetune::tuner
