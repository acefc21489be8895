// Measured workload runs (see bench_runner.h).
#include "tuner/bench_runner.h"

#include "loadgen/server_metrics.h"

#include <sys/resource.h>

#include <cmath>
#include <limits>

#include "loadgen/report.h"
#include "loadgen/server_metrics.h"
#include "servetune/engine.h"
#include "tokenizer/tokenizer.h"
#include "tuner/calibration.h"

namespace servetune::tuner {

double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void add_engine_deltas(nlohmann::ordered_json& m, const EngineStats& a, const EngineStats& b) {
  const int64_t steps = b.steps - a.steps;
  const int64_t batched = b.batched_tokens - a.batched_tokens;
  const int64_t query = b.prefix_query_tokens - a.prefix_query_tokens;
  const int64_t hit = b.prefix_hit_tokens - a.prefix_hit_tokens;
  const double running_sum = b.mean_running * static_cast<double>(b.steps) - a.mean_running * static_cast<double>(a.steps);
  m["engine_steps"] = steps;
  m["engine_batched_tokens"] = batched;
  m["engine_mean_batch_tokens"] = steps > 0 ? static_cast<double>(batched) / static_cast<double>(steps) : 0.0;
  m["engine_mean_running"] = steps > 0 ? running_sum / static_cast<double>(steps) : 0.0;
  m["engine_prompt_tokens"] = b.prompt_tokens - a.prompt_tokens;
  m["engine_generation_tokens"] = b.generation_tokens - a.generation_tokens;
  m["engine_preemptions"] = b.preemptions - a.preemptions;
  // Tensor parallelism's communication cost (and waits for slower ranks) against the forward passes' time.
  const double forward = b.forward_seconds - a.forward_seconds, comm = b.comm_seconds - a.comm_seconds;
  const double wait = b.comm_wait_seconds - a.comm_wait_seconds;
  m["engine_forward_seconds"] = forward;
  m["engine_comm_seconds"] = comm;
  m["engine_comm_wait_seconds"] = wait;
  m["engine_comm_ms_per_step"] = steps > 0 ? 1000.0 * comm / static_cast<double>(steps) : 0.0;
  m["engine_comm_fraction"] = forward > 0 ? comm / forward : 0.0;
  m["engine_comm_wait_fraction"] = forward > 0 ? wait / forward : 0.0;
  m["engine_prefix_hit_tokens"] = hit;
  m["engine_prefix_cache_hit_rate"] = query > 0 ? static_cast<double>(hit) / static_cast<double>(query) : 0.0;
}

std::optional<loadgen::SpecDecodeStats> spec_decode_delta(const Engine& engine, const EngineStats& before,
                                                          const EngineStats& after) {
  if (engine.config().speculative_algorithm == SpeculativeAlgorithm::kNone) return std::nullopt;
  const auto counters = [](const EngineStats& s) {
    return loadgen::SpecDecodeStats{s.spec_num_drafts, s.spec_draft_tokens, s.spec_accepted_tokens, s.spec_accepted_per_position};
  };
  return loadgen::spec_decode_difference(counters(after), counters(before));
}

RunOutput run_workload(loadgen::Client& client, const datasets::Workload& workload, const WorkloadSpec& spec,
                       const std::vector<double>& percentiles, const Tokenizer& tokenizer, Engine* engine) {
  loadgen::RunSpec run_spec;
  run_spec.max_concurrency = spec.max_concurrency.value_or(0);
  run_spec.params.ignore_eos = spec.ignore_eos;
  run_spec.params.temperature = spec.temperature;
  const size_t n = workload.requests.size();
  if (spec.num_warmups > 0 && n > 0) {
    loadgen::RunSpec warm = run_spec;
    for (int64_t i = 0; i < spec.num_warmups; ++i) warm.requests.push_back({&workload.requests[static_cast<size_t>(i) % n], 0.0});
    client.run(warm);
  }
  const std::vector<double> arrivals =
      workload.timed ? std::vector<double>{} : loadgen::arrival_times(n, spec.request_rate, spec.burstiness, spec.data.seed);
  for (size_t i = 0; i < n; ++i) {
    run_spec.requests.push_back({&workload.requests[i], workload.timed ? workload.requests[i].arrival_s.value_or(0.0) : arrivals[i]});
  }
  const double calib_before = engine != nullptr ? calibration_ms() : 0.0;
  const EngineStats before = engine != nullptr ? engine->stats() : EngineStats{};
  const double cpu_before = process_cpu_s();
  const loadgen::RunResult run = client.run(run_spec);
  const double cpu_s = process_cpu_s() - cpu_before;
  const EngineStats after = engine != nullptr ? engine->stats() : EngineStats{};
  const double calib = engine != nullptr ? 0.5 * (calib_before + calibration_ms()) : 0.0;

  const auto count_tokens = [&](const std::string& text) {
    return static_cast<int64_t>(tokenizer.encode(text, false, false).size());
  };
  const loadgen::BenchmarkMetrics m = loadgen::compute_metrics(run.outputs, run.duration_s, percentiles, {}, count_tokens);
  loadgen::ReportOptions ro;
  ro.percentile_metrics = loadgen::percentile_metric_names();  // every metric a sweep spec's SLO may name
  ro.percentiles = percentiles;
  ro.max_concurrency = spec.max_concurrency.value_or(0);
  ro.request_rate = workload.timed ? std::numeric_limits<double>::infinity() : spec.request_rate;
  ro.burstiness = spec.burstiness;
  if (engine != nullptr) ro.spec_decode = spec_decode_delta(*engine, before, after);
  nlohmann::ordered_json all = loadgen::metrics_json(m, run, ro, false);

  RunOutput out;
  out.completed = m.completed;
  out.failed = m.failed;
  for (const auto& r : run.outputs) {
    if (!r.success && out.first_error.empty()) out.first_error = loadgen::failure_reason(r.error);
  }
  out.metrics = nlohmann::ordered_json::object();
  out.per_request = nlohmann::ordered_json::object();
  for (const auto& [k, v] : all.items()) {
    (v.is_array() && k != "spec_decode_per_position_acceptance_rates" ? out.per_request : out.metrics)[k] = v;
  }
  out.per_request["output_lens"] = m.actual_output_lens;
  if (engine != nullptr) {
    out.metrics["process_cpu_s"] = cpu_s;
    const double tokens = static_cast<double>(m.total_input + m.total_output);
    out.metrics["cpu_ms_per_token"] = tokens > 0 ? cpu_s * 1000.0 / tokens : 0.0;
    out.metrics["calibration_ms"] = calib;
    out.metrics["calibrated_cpu_per_token"] = tokens > 0 && calib > 0 ? cpu_s * 1000.0 / tokens / calib : 0.0;
    add_engine_deltas(out.metrics, before, after);
  }
  return out;
}

}  // namespace servetune::tuner
