// The shared measured run (see measurement.h).
#include "tuner/measurement.h"

#include <sys/resource.h>

#include <cmath>
#include <limits>

#include "loadgen/server_metrics.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"
#include "tuner/calibration.h"

namespace servetune::tuner {
namespace {

// User + system CPU seconds this process has used so far.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The engine's speculative-decoding counters over the run; nullopt when it does not speculate.
std::optional<loadgen::SpecDecodeStats> spec_decode_delta(const Engine& engine, const EngineStats& before,
                                                          const EngineStats& after) {
  if (engine.config().speculative_algorithm == SpeculativeAlgorithm::kNone) return std::nullopt;
  const auto counters = [](const EngineStats& s) {
    return loadgen::SpecDecodeStats{s.spec_num_drafts, s.spec_draft_tokens, s.spec_accepted_tokens,
                                    s.spec_accepted_per_position, s.spec_draft_seconds, s.spec_disabled_steps};
  };
  return loadgen::spec_decode_difference(counters(after), counters(before));
}

loadgen::RunSpec base_spec(const MeasureOptions& o) {
  loadgen::RunSpec spec;
  spec.max_concurrency = o.max_concurrency;
  spec.params = o.params;
  return spec;
}

}  // namespace

const loadgen::RequestOutput* Measurement::first_failure() const {
  for (const auto& r : run.outputs) {
    if (!r.success) return &r;
  }
  return nullptr;
}

WarmupOutcome warm_up(loadgen::Client& client, const datasets::Workload& workload, const MeasureOptions& o) {
  WarmupOutcome out;
  const size_t n = workload.requests.size();
  if (o.num_warmups <= 0 || n == 0) return out;
  loadgen::RunSpec spec = base_spec(o);
  for (int64_t i = 0; i < o.num_warmups; ++i) {
    const size_t pick = o.warmups == WarmupRequests::kFirst ? 0 : static_cast<size_t>(i) % n;
    spec.requests.push_back({&workload.requests[pick], 0.0});
  }
  const loadgen::RunResult run = client.run(spec);
  out.sent = o.num_warmups;
  for (const auto& r : run.outputs) {
    if (r.success) continue;
    if (out.failed++ == 0) out.first_error = r.error;
  }
  return out;
}

Measurement measure(loadgen::Client& client, const datasets::Workload& workload, const MeasureOptions& o,
                    const Tokenizer& tokenizer) {
  loadgen::RunSpec spec = base_spec(o);
  const size_t n = workload.requests.size();
  // With sessions the arrival process starts sessions: arrival k goes to the k-th session's first turn.
  size_t starts = 0;
  for (const datasets::SampleRequest& r : workload.requests) starts += !workload.sessions || r.turn == 0 ? 1 : 0;
  const std::vector<double> arrivals =
      workload.timed ? std::vector<double>{} : loadgen::arrival_times(starts, o.request_rate, o.burstiness, o.arrival_seed);
  const std::vector<double> thinks = workload.sessions ? think_times(workload, o.think_time_s, o.think_time_dist, o.arrival_seed, o.think_time_trace)
                                                       : std::vector<double>(n, 0.0);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const datasets::SampleRequest& r = workload.requests[i];
    double at = 0.0;
    if (workload.timed) {
      at = r.arrival_s.value_or(0.0);
    } else if (!workload.sessions || r.turn == 0) {
      at = arrivals[k++];
    } else {
      at = spec.requests.back().scheduled_s;  // keeps the plan non-decreasing; a later turn's own time is dynamic
    }
    spec.requests.push_back({&r, at, thinks[i]});
  }
  spec.sessions = workload.sessions;
  spec.render = workload.render;

  Measurement m;
  const bool scrape = o.engine == nullptr && !o.server_metrics_url.empty();
  const double calib_before = o.calibrate_cpu ? calibration_ms() : 0.0;
  if (o.engine != nullptr) m.stats_before = o.engine->stats();
  const auto text_before = scrape ? loadgen::scrape_metrics(o.server_metrics_url, o.api_key) : std::nullopt;
  const double cpu_before = process_cpu_s();
  m.run = client.run(spec);
  const double cpu_s = process_cpu_s() - cpu_before;
  if (o.engine != nullptr) m.stats_after = o.engine->stats();
  const auto text_after = text_before ? loadgen::scrape_metrics(o.server_metrics_url, o.api_key) : std::nullopt;
  const auto server_before = text_before ? loadgen::parse_spec_decode_counters(*text_before) : std::nullopt;
  const auto server_after = text_after ? loadgen::parse_spec_decode_counters(*text_after) : std::nullopt;
  if (o.process_cpu || o.calibrate_cpu) m.process_cpu_s = cpu_s;
  if (o.calibrate_cpu) m.calibration_ms = 0.5 * (calib_before + calibration_ms());

  const auto count_tokens = [&](const std::string& text) {
    return static_cast<int64_t>(tokenizer.encode(text, false, false).size());
  };
  m.metrics = loadgen::compute_metrics(m.run.outputs, m.run.duration_s, o.percentiles, o.slo, count_tokens);
  loadgen::ReportOptions& ro = m.report;
  ro.percentile_metrics = o.percentile_metrics;
  ro.percentiles = o.percentiles;
  ro.max_concurrency = o.max_concurrency;
  ro.request_rate = workload.timed ? std::numeric_limits<double>::infinity() : o.request_rate;
  ro.burstiness = o.burstiness;
  ro.slo = o.slo;
  if (o.engine != nullptr) {
    ro.spec_decode = spec_decode_delta(*o.engine, *m.stats_before, *m.stats_after);
  } else if (server_before && server_after) {
    ro.spec_decode = loadgen::spec_decode_difference(*server_after, *server_before);
  }
  if (workload.sessions) {
    loadgen::SessionMetrics& s = ro.sessions.emplace(
        loadgen::compute_session_metrics(m.run.outputs, m.run.duration_s, o.percentiles, count_tokens));
    s.vllm_turns = loadgen::vllm_turn_stats(spec, m.run, count_tokens);
    if (o.engine != nullptr) {
      s.prefix_cache_hit_rate = m.stats_after->since(*m.stats_before).prefix_cache_hit_rate();
      s.prefix_cache_source = "built-in engine: prefix-cache hit tokens / looked-up prompt tokens";
    } else if (text_before && text_after) {
      const auto before = loadgen::parse_prefix_cache_counters(*text_before);
      const auto after = loadgen::parse_prefix_cache_counters(*text_after);
      const auto rate = before && after ? loadgen::prefix_cache_hit_rate(*before, *after) : std::nullopt;
      if (rate) {
        s.prefix_cache_hit_rate = rate->rate;
        s.prefix_cache_source = rate->source;
      }
    }
  }
  return m;
}

nlohmann::ordered_json engine_stats_json(const Measurement& m) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!m.stats_before || !m.stats_after) return j;
  const EngineStats d = m.stats_after->since(*m.stats_before);
  j["engine_steps"] = d.steps;
  j["engine_batched_tokens"] = d.batched_tokens;
  j["engine_mean_batch_tokens"] = d.mean_batch_tokens();
  j["engine_mean_running"] = d.mean_running();
  j["engine_prompt_tokens"] = d.prompt_tokens;
  j["engine_generation_tokens"] = d.generation_tokens;
  j["engine_preemptions"] = d.preemptions;
  j["engine_idle_batches"] = d.idle_batches;
  // Tensor parallelism's communication cost (and waits for slower ranks) against the forward passes' time.
  const double forward = d.forward_seconds, comm = d.comm_seconds, wait = d.comm_wait_seconds;
  j["engine_forward_seconds"] = forward;
  j["engine_comm_seconds"] = comm;
  j["engine_comm_wait_seconds"] = wait;
  j["engine_comm_ms_per_step"] = d.steps > 0 ? 1000.0 * comm / static_cast<double>(d.steps) : 0.0;
  j["engine_comm_fraction"] = forward > 0 ? comm / forward : 0.0;
  j["engine_comm_wait_fraction"] = forward > 0 ? wait / forward : 0.0;
  // The same time split by kind of collective, with the payload bytes (rank 0's) that a cost model predicts.
  for (size_t k = 0; k < kCollectiveKinds; ++k) {
    const std::string key = std::string("engine_comm_") + collective_kind_name(static_cast<CollectiveKind>(k));
    j[key + "_calls"] = d.collectives[k].calls;
    j[key + "_bytes"] = d.collectives[k].bytes;
    j[key + "_seconds"] = d.collectives[k].seconds;
  }
  j["engine_prefix_hit_tokens"] = d.prefix_hit_tokens;
  j["engine_prefix_cache_hit_rate"] = d.prefix_cache_hit_rate();
  j["engine_kv_bytes_per_token"] = d.kv_bytes_per_token;
  if (d.moe_experts > 0) j["engine_moe_expert_imbalance"] = d.moe_expert_imbalance();
  if (d.moe_ep_groups > 1) j["engine_moe_ep_imbalance"] = d.moe_ep_imbalance();
  return j;
}

nlohmann::ordered_json cpu_json(const Measurement& m) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!m.process_cpu_s) return j;
  const double cpu_s = *m.process_cpu_s;
  j["process_cpu_s"] = cpu_s;
  if (!m.calibration_ms) return j;
  const double tokens = static_cast<double>(m.metrics.total_input + m.metrics.total_output);
  const double calib = *m.calibration_ms;
  j["cpu_ms_per_token"] = tokens > 0 ? cpu_s * 1000.0 / tokens : 0.0;
  j["calibration_ms"] = calib;
  j["calibrated_cpu_per_token"] = tokens > 0 && calib > 0 ? cpu_s * 1000.0 / tokens / calib : 0.0;
  return j;
}

}  // namespace servetune::tuner
