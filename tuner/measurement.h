// One measured run of a workload, shared by `servetune bench` and the sweep: warm-ups, the timed client run
// (in-process or HTTP) and vLLM's metrics, plus the parts its options switch on: the built-in engine's statistics
// before and after, a server's /metrics counters before and after, this process's CPU time, the CPU calibration.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/dataset.h"
#include "loadgen/client.h"
#include "loadgen/report.h"
#include "servetune/engine.h"
#include "tuner/think_time.h"

namespace servetune {
class Tokenizer;
}  // namespace servetune

namespace servetune::tuner {

// Which requests the warm-ups send (at time 0, under the run's concurrency cap).
enum class WarmupRequests {
  kFirst,  // the workload's first request, num_warmups times (vLLM's convention; `bench`)
  kCycle,  // requests 0, 1, 2, ... in turn, wrapping around (the sweep)
};

struct MeasureOptions {
  // Traffic: ignored for a timed workload (a trace), which replays its own arrival times.
  double request_rate = std::numeric_limits<double>::infinity();  // +inf: every request at t = 0
  double burstiness = 1.0;
  uint64_t arrival_seed = 0;
  int64_t max_concurrency = 0;  // 0: unlimited
  loadgen::RequestParams params;
  int64_t num_warmups = 0;
  WarmupRequests warmups = WarmupRequests::kFirst;
  // Multi-turn workloads: request_rate and max_concurrency apply to sessions; a later turn is sent after the
  // previous reply plus a think time (think_time.h: think_time_s fixed or exponential, or a trace file's values
  // sampled or replayed; seeded by arrival_seed).
  double think_time_s = 0.0;
  std::string think_time_dist = "fixed";
  std::string think_time_trace;

  // Metrics: percentiles, which metrics get summaries, goodput SLOs.
  std::vector<double> percentiles = {99.0};
  std::vector<std::string> percentile_metrics = loadgen::percentile_metric_names();
  loadgen::GoodputSlo slo;

  // Parts, each on when given. The built-in engine behind the client: its step statistics over the run and its
  // speculative-decoding counters.
  Engine* engine = nullptr;
  // A server's Prometheus endpoint (e.g. http://host:port/metrics) with its bearer key: its speculative-decoding
  // counters over the run, when it exposes vLLM's. Unused with `engine`.
  std::string server_metrics_url;
  std::string api_key;
  bool process_cpu = false;  // this process's user + system CPU seconds over the run
  // The reference workload (calibration.h) before and after the run, to normalise CPU time (implies process_cpu).
  bool calibrate_cpu = false;
};

struct WarmupOutcome {
  int64_t sent = 0;
  int64_t failed = 0;
  std::string first_error;  // of the first failed warm-up request
};

struct Measurement {
  loadgen::RunResult run;
  loadgen::BenchmarkMetrics metrics;
  loadgen::ReportOptions report;  // how to print and save it; spec_decode set when the engine or server speculates,
                                  // sessions for a multi-turn workload
  std::optional<EngineStats> stats_before, stats_after;  // with options.engine
  std::optional<double> process_cpu_s;                  // with options.process_cpu or calibrate_cpu
  std::optional<double> calibration_ms;                 // with options.calibrate_cpu: mean of before and after

  // The first failed request, if any.
  const loadgen::RequestOutput* first_failure() const;
};

// The warm-up requests of `options` (none when num_warmups is 0); their results are not kept.
WarmupOutcome warm_up(loadgen::Client& client, const datasets::Workload& workload, const MeasureOptions& options);

// The measured run. `tokenizer` counts generated tokens when a server reports no usage.
Measurement measure(loadgen::Client& client, const datasets::Workload& workload, const MeasureOptions& options,
                    const Tokenizer& tokenizer);

// The built-in engine's counters over the run (after minus before) as engine_* keys: steps, batch sizes,
// prompt/generation tokens, preemptions, prefix-cache hit tokens and rate, forward-pass and collective (tensor-
// parallel communication) seconds. Empty without the engine's statistics.
nlohmann::ordered_json engine_stats_json(const Measurement& m);

// process_cpu_s, and with the calibration cpu_ms_per_token, calibration_ms and calibrated_cpu_per_token (CPU time
// per input + output token, plain and in units of the reference workload). Empty when CPU time was not measured.
nlohmann::ordered_json cpu_json(const Measurement& m);

}  // namespace servetune::tuner
