// Running one trial (see trial_runner.h).
#include "tuner/trial_runner.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <new>
#include <thread>

#include "loadgen/report.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "tuner/accuracy.h"
#include "tuner/interrupt.h"
#include "tuner/load_search.h"
#include "tuner/measurement.h"
#include "tuner/noise.h"
#include "tuner/server_command.h"
#include "tuner/server_process.h"

namespace servetune::tuner {
namespace fs = std::filesystem;
namespace {

constexpr int kChildFailed = 3;  // the candidate failed and its marker is written
constexpr int kChildError = 4;   // an error that stops the sweep (printed by the child)
constexpr int kChildLost = 5;    // the parent was gone before the child started

const char* status_name(TrialStatus s) {
  switch (s) {
    case TrialStatus::kOk: return "ok";
    case TrialStatus::kFailed: return "failed";
    case TrialStatus::kSkipped: return "skipped";
  }
  return "";
}

std::string run_summary(const Measurement& m) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%lld ok, %lld failed, %.1f tok/s total, TPOT %.1f ms",
                static_cast<long long>(m.metrics.completed), static_cast<long long>(m.metrics.failed),
                m.metrics.total_token_throughput, m.metrics.tpot_ms.mean);
  return buf;
}

// Repeat r samples with seed + r: repeats measure the same distribution without replaying the same prompts into
// the prefix cache of the engine that served them a moment ago.
WorkloadSpec for_repeat(const WorkloadSpec& w, int repeat) {
  WorkloadSpec out = w;
  out.data.seed += static_cast<uint64_t>(repeat);
  return out;
}

// The measurement of one run on a launched candidate: the workload's traffic, every percentile metric a sweep's
// SLO may name, and the parts the session offers: the engine's statistics and this process's CPU time with the
// calibration (built-in: the engine runs in this process), or the server's /metrics counters (external).
MeasureOptions measure_options(const WorkloadSpec& w, const SweepSpec& spec, Session& session) {
  const std::vector<double>& percentiles = spec.percentiles;
  MeasureOptions o;
  o.request_rate = w.request_rate;
  o.burstiness = w.burstiness;
  o.arrival_seed = w.data.seed;
  o.max_concurrency = w.max_concurrency.value_or(0);
  o.params.ignore_eos = w.ignore_eos;
  o.params.temperature = w.temperature;
  o.num_warmups = w.num_warmups;
  o.warmups = WarmupRequests::kCycle;
  o.think_time_s = w.think_time_s;
  o.think_time_dist = w.think_time_dist;
  o.think_time_trace = w.think_time_trace;
  o.percentiles = percentiles;
  o.percentile_metrics = loadgen::percentile_metric_names();
  o.slo = goodput_slo_of(spec.slo);
  o.engine = session.engine();
  o.server_metrics_url = session.metrics_url();
  o.api_key = session.api_key();
  o.calibrate_cpu = o.engine != nullptr;
  return o;
}

// A record's metrics: vLLM's keys and servetune's additions without the per-request arrays (but with the
// per-position acceptance rates), the CPU time and the engine's counters; the arrays go to raw/ (`per_request`).
void record_metrics(const Measurement& m, nlohmann::ordered_json& metrics, nlohmann::ordered_json& per_request) {
  metrics = nlohmann::ordered_json::object();
  per_request = nlohmann::ordered_json::object();
  const nlohmann::ordered_json all = loadgen::metrics_json(m.metrics, m.run, m.report, false);
  for (const auto& [k, v] : all.items()) {
    (v.is_array() && k != "spec_decode_per_position_acceptance_rates" ? per_request : metrics)[k] = v;
  }
  per_request["output_lens"] = m.metrics.actual_output_lens;
  metrics.update(cpu_json(m));
  metrics.update(engine_stats_json(m));
}

}  // namespace

TrialRunner::TrialRunner(const SweepSpec& spec, const SearchSpace& space, ResultsStore& store, Launcher& launcher,
                         Progress& progress, const Tokenizer& tokenizer)
    : spec_(spec), space_(space), store_(store), launcher_(launcher), progress_(progress), tokenizer_(tokenizer),
      environment_(loadgen::environment_json(SERVETUNE_VERSION)) {}

bool TrialRunner::run(const Trial& t) { return spec_.builtin() ? run_isolated(t) : run_here(t); }

void TrialRunner::skip(const Trial& t) {
  TrialMarker m;
  m.status = TrialStatus::kSkipped;
  m.reason = t.candidate.skip_reason;
  write_marker(t, m);
}

void TrialRunner::record_failure(const Trial& t, TrialFailure kind, const std::string& reason, const std::string& log) {
  TrialMarker m;
  m.status = TrialStatus::kFailed;
  m.failure = kind;
  m.reason = reason;
  m.log = log;
  m.started = now_iso8601();
  progress_.note(t.candidate.id + " (" + t.candidate.label + "): failed (" + trial_failure_name(kind) + "): " + reason);
  write_marker(t, m);
}

nlohmann::ordered_json TrialRunner::candidate_info(const Candidate& c) const {
  nlohmann::ordered_json j;
  j["id"] = c.id;
  j["label"] = c.label;
  j["settings"] = c.settings;
  j["full_settings"] = space_.full_settings(c);
  j["engine"] = spec_.builtin() ? std::string("builtin") : server_for(spec_, space_.full_settings(c)).name;
  if (!spec_.builtin()) {
    const auto& server = server_for(spec_, space_.full_settings(c));
    if (!server.version.empty()) j["engine_version"] = server.version;
  }
  return j;
}

void TrialRunner::write_marker(const Trial& t, const TrialMarker& marker) {
  nlohmann::ordered_json m;
  m["candidate"] = t.candidate.id;
  m["tag"] = t.tag;
  nlohmann::ordered_json info = candidate_info(t.candidate);
  if (!marker.command.empty()) info["command"] = marker.command;
  m["candidate_info"] = info;
  nlohmann::ordered_json ws = nlohmann::ordered_json::array();
  for (const auto& w : t.workloads) ws.push_back(w.name);
  m["workloads"] = ws;
  m["repeat"] = spec_.repeat;
  m["status"] = status_name(marker.status);
  m["failure"] = trial_failure_name(marker.failure);
  m["reason"] = marker.reason;
  m["launch_id"] = marker.launch_id;
  m["log"] = marker.log;
  m["started"] = marker.started;
  m["finished"] = now_iso8601();
  store_.write_trial(m);
}

const datasets::Workload& TrialRunner::workload(const WorkloadSpec& w) {
  const std::string key = w.name + "#" + std::to_string(w.data.seed);
  auto it = workloads_.find(key);
  if (it == workloads_.end()) it = workloads_.emplace(key, datasets::load_workload(w.data, tokenizer_)).first;
  return it->second;
}

void TrialRunner::load_workloads(const Trial& t) {
  for (const auto& w : t.workloads) {
    for (int r = 0; r < spec_.repeat; ++r) workload(for_repeat(w, r));
  }
}

// A built-in candidate runs in a child process, so an engine that crashes or hangs fails that candidate, not the
// sweep. The child writes the records and the marker; the parent writes the marker when the child dies. The
// child dies with the parent (PR_SET_PDEATHSIG), so a killed sweep leaves nothing running.
bool TrialRunner::run_isolated(const Trial& t) {
  load_workloads(t);
  if (spec_.accuracy) check_accuracy_text(spec_);  // the sweep's error, as a bad dataset is
  const size_t runs = max_runs(t.workloads, spec_.repeat);
  const auto t0 = std::chrono::steady_clock::now();
  std::fflush(nullptr);
  progress_.before_fork();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    reset_interrupt_handlers();  // the sweep's handler stops this process; its own would keep it running
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(kChildLost);
    progress_.after_fork_child();
    int code = kChildFailed;
    try {
      code = run_here(t) ? 0 : kChildFailed;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "servetune: error: %s\n", e.what());
      code = kChildError;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  progress_.after_fork_parent();
  if (pid < 0) throw Error(ErrorKind::kIo, std::string("cannot fork for the candidate: ") + std::strerror(errno));
  set_interrupt_target(pid);
  if (interrupted_by() != 0) ::kill(pid, SIGTERM);  // the signal came between the fork and the line above
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!timed_out && spec_.target.trial_timeout_s > 0 && elapsed > spec_.target.trial_timeout_s) {
      ::kill(pid, SIGKILL);
      timed_out = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  set_interrupt_target(0);
  progress_.child_done(runs, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (WIFEXITED(status) && WEXITSTATUS(status) == kChildError) throw Error(ErrorKind::kInternal, "the sweep stopped (see the error above)");
  if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == kChildFailed) && store_.trial(t.candidate.id, t.tag)) {
    return WEXITSTATUS(status) == 0;
  }
  TrialMarker m;
  m.status = TrialStatus::kFailed;
  m.failure = TrialFailure::kCrashed;
  m.reason = "the engine process died (" + describe_wait_status(status) + ")";
  if (interrupted_by() != 0) {
    m.failure = TrialFailure::kInterrupted;
    m.reason = interruption_reason();
  } else if (timed_out) {
    m.failure = TrialFailure::kTimedOut;
    m.reason =
        "the candidate ran longer than target.trial_timeout_s = " + format_duration(spec_.target.trial_timeout_s);
  } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
    m.failure = TrialFailure::kOom;
    m.reason += "; SIGKILL from outside the sweep is usually the kernel's out-of-memory killer";
  }
  progress_.note(t.candidate.id + " (" + t.candidate.label + "): failed (" + trial_failure_name(m.failure) +
                 "): " + m.reason);
  write_marker(t, m);
  return false;
}

// Returns false when the candidate failed (the failure is recorded; the sweep goes on).
bool TrialRunner::run_here(const Trial& t) {
  TrialMarker marker;
  marker.launch_id = new_launch_id();
  marker.started = now_iso8601();
  std::vector<std::string> names;
  for (const auto& w : t.workloads) names.push_back(w.name);
  store_.discard_partial(t.candidate.id, names);
  // Datasets first: a bad dataset is the sweep's error, not the candidate's.
  load_workloads(t);
  if (spec_.accuracy) check_accuracy_text(spec_);
  const size_t runs = max_runs(t.workloads, spec_.repeat);
  progress_.trial_started(t.candidate.id, t.candidate.label, runs);
  size_t done = 0;
  const auto fail = [&](TrialFailure kind, std::string why) {
    if (interrupted_by() != 0) {  // whatever the signal made the candidate do, the reason is the signal
      kind = TrialFailure::kInterrupted;
      why = interruption_reason();
    }
    progress_.skip_runs(runs - done);
    progress_.note(t.candidate.id + " (" + t.candidate.label + "): failed (" + trial_failure_name(kind) + "): " + why);
    marker.status = TrialStatus::kFailed;
    marker.failure = kind;
    marker.reason = why;
    write_marker(t, marker);
    return false;
  };
  try {
    if (interrupted_by() != 0) throw LaunchFailure(TrialFailure::kInterrupted, "");
    // The baseline's log-probabilities first (once per run folder), while no candidate holds the memory (or the port).
    const double baseline_ppl = spec_.accuracy ? ensure_accuracy_baseline(spec_, space_, store_.dir(), launcher_, tokenizer_) : 0.0;
    std::unique_ptr<Session> session = launcher_.start(t.candidate, store_.dir(), t.tag);
    marker.log = session->log();
    accuracy_ = nlohmann::ordered_json::object();
    if (spec_.accuracy) {
      progress_.note(t.candidate.id + ": accuracy on " + spec_.accuracy->dataset);
      try {
        accuracy_ = measure_accuracy(*session, tokenizer_, spec_, store_.dir(), baseline_ppl);
      } catch (const Error& e) {  // e.g. a KV cache too small for accuracy.ctx: this candidate's failure
        throw LaunchFailure(TrialFailure::kRequestsFailed, std::string("the accuracy run failed: ") + e.what());
      }
    }
    marker.command = session->command();
    nlohmann::ordered_json info = candidate_info(t.candidate);
    if (!marker.command.empty()) info["command"] = marker.command;
    for (const auto& w : t.workloads) {
      if (w.search) {
        search_load(w, *session, info, t, marker, done);
        continue;
      }
      std::vector<double> objective;  // repeat: auto: the objective metric of each repeat so far
      for (int r = 0; r < spec_.repeat; ++r) {
        nlohmann::ordered_json metrics;
        const Measurement m = run_once(w, w, r, *session, info, t, marker, metrics);
        ++done;
        check_failed_requests(m, w.name);
        if (r + 1 < spec_.repeat && precise_enough(metrics, objective)) {
          progress_.skip_runs(static_cast<size_t>(spec_.repeat - r - 1));
          done += static_cast<size_t>(spec_.repeat - r - 1);
          break;
        }
      }
    }
    session.reset();
  } catch (const LaunchFailure& f) {
    if (marker.log.empty()) marker.log = f.log();
    return fail(f.kind(), f.what());
  } catch (const std::bad_alloc&) {
    return fail(TrialFailure::kOom, "out of memory during the benchmark");
  }
  write_marker(t, marker);
  return true;
}

// Repeat r of `level` on the prompts of `prompts` (the level itself, or a searched workload whose levels share its
// prompts): measured, checked alive, recorded; its metrics into `metrics`.
Measurement TrialRunner::run_once(const WorkloadSpec& level, const WorkloadSpec& prompts, int r, Session& session,
                                  const nlohmann::ordered_json& info, const Trial& t, const TrialMarker& marker,
                                  nlohmann::ordered_json& metrics) {
  if (interrupted_by() != 0) throw LaunchFailure(TrialFailure::kInterrupted, "");
  progress_.run_started(level.name, r);
  const MeasureOptions options = measure_options(for_repeat(level, r), spec_, session);
  const datasets::Workload& data = workload(for_repeat(prompts, r));
  warm_up(session.client(), data, options);
  // The warm-up sent these prompts, and an earlier run or level the same ones: the measured run starts cold.
  if (spec_.target.flush_prefix_cache) session.flush_cache();
  Measurement m = measure(session.client(), data, options, tokenizer_);
  session.check_alive(m.metrics.failed > 0 ? 3.0 : 0.0);
  nlohmann::ordered_json per_request;
  record_metrics(m, metrics, per_request);
  metrics.update(accuracy_);
  write_record(info, level, r, metrics, per_request, t.tag, marker.launch_id, session.engine());
  progress_.run_finished(run_summary(m));
  return m;
}

// SLA search: measures the levels a LoadSearch asks for (each `repeat` times, the SLOs judged on the medians; a run
// with more failed requests than target.max_failed_fraction fails its level), one record per run under the level's
// name, as list levels are recorded.
void TrialRunner::search_load(const WorkloadSpec& w, Session& session, const nlohmann::ordered_json& info, const Trial& t,
                              const TrialMarker& marker, size_t& done) {
  const WorkloadSpec::Search& s = *w.search;
  LoadSearch search(s.lo, s.hi, s.steps, s.concurrency);
  while (const std::optional<double> level = search.next()) {
    WorkloadSpec at = w;
    at.search.reset();
    std::ostringstream name;
    name << w.group << "@" << (s.concurrency ? "c" : "r") << *level;
    at.name = name.str();
    if (s.concurrency) at.max_concurrency = static_cast<int64_t>(*level);
    else at.request_rate = *level;
    std::map<std::string, std::vector<double>> slo_values;
    bool overloaded = false;
    for (int r = 0; r < spec_.repeat; ++r) {
      nlohmann::ordered_json metrics;
      const Measurement m = run_once(at, w, r, session, info, t, marker, metrics);  // the prompts do not depend on the level
      ++done;
      // Past its capacity a server may time requests out: the level does not hold, and the search goes below it
      // (the results table scores it infeasible), rather than the candidate failing as a fixed level would.
      const int64_t asked = m.metrics.failed + m.metrics.completed;
      if (asked == 0 || static_cast<double>(m.metrics.failed) > spec_.target.max_failed_fraction * static_cast<double>(asked)) {
        overloaded = true;
      }
      for (const auto& [key, bound] : spec_.slo) {
        if (const auto it = metrics.find(key); it != metrics.end() && it->is_number()) slo_values[key].push_back(it->get<double>());
      }
    }
    bool holds = !overloaded;
    for (const auto& [key, bound] : spec_.slo) {
      const auto it = slo_values.find(key);
      holds = holds && it != slo_values.end() && median(it->second) <= bound;
    }
    search.record(*level, holds);
  }
  const size_t planned = static_cast<size_t>(s.steps) * static_cast<size_t>(spec_.repeat);
  const size_t ran = static_cast<size_t>(search.steps()) * static_cast<size_t>(spec_.repeat);
  if (ran < planned) {
    progress_.skip_runs(planned - ran);
    done += planned - ran;
  }
}

// repeat: auto: adds this repeat's objective metric to `samples` and says whether the repeats so far are enough: at
// least repeat_min of them, and the 95% interval of their mean within +-repeat_width of it. A workload without the
// metric (or a mean of 0) runs every repeat.
bool TrialRunner::precise_enough(const nlohmann::ordered_json& metrics, std::vector<double>& samples) const {
  if (spec_.repeat_width <= 0.0) return false;
  const auto it = metrics.find(spec_.objective.metric);
  if (it == metrics.end() || !it->is_number()) return false;
  samples.push_back(it->get<double>());
  if (static_cast<int>(samples.size()) < spec_.repeat_min) return false;
  const std::optional<MeanInterval> ci = mean_interval(samples);
  return ci && ci->mean != 0.0 && (ci->high - ci->low) / 2.0 <= spec_.repeat_width * std::fabs(ci->mean);
}

// A run with more failed requests than target.max_failed_fraction fails the trial (its record is kept): a
// candidate that served 24% of its requests must not win on the throughput of the rest.
void TrialRunner::check_failed_requests(const Measurement& m, const std::string& workload) const {
  const int64_t failed = m.metrics.failed;
  const int64_t total = failed + m.metrics.completed;
  if (failed == 0 || total == 0) return;
  const loadgen::RequestOutput* first = m.first_failure();
  const std::string reason = first != nullptr ? loadgen::failure_reason(first->error) : std::string();
  if (m.metrics.completed == 0) {
    const bool timed_out = first != nullptr && first->failure == loadgen::RequestFailure::kTimedOut;
    throw LaunchFailure(timed_out ? TrialFailure::kTimedOut : TrialFailure::kRequestsFailed,
                        "every request of " + workload + " failed: " + reason);
  }
  const double fraction = static_cast<double>(failed) / static_cast<double>(total);
  if (fraction <= spec_.target.max_failed_fraction) return;
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%lld of %lld requests of %s failed (%.1f%%, above target.max_failed_fraction = %g%%)",
                static_cast<long long>(failed), static_cast<long long>(total), workload.c_str(), 100.0 * fraction,
                100.0 * spec_.target.max_failed_fraction);
  throw LaunchFailure(TrialFailure::kRequestsFailed, std::string(buf) + "; the first: " + reason);
}

void TrialRunner::write_record(const nlohmann::ordered_json& info, const WorkloadSpec& w, int repeat,
                               const nlohmann::ordered_json& metrics, const nlohmann::ordered_json& per_request,
                               const std::string& tag, const std::string& launch_id, const Engine* engine) {
  nlohmann::ordered_json r;
  r["schema"] = kRecordSchema;
  r["candidate"] = info;
  r["workload"] = w.to_json();
  r["workload"]["seed_used"] = w.data.seed + static_cast<uint64_t>(repeat);
  r["repeat"] = repeat;
  r["metrics"] = metrics;
  nlohmann::ordered_json p;
  p["source"] = "measured";
  p["tool"] = "servetune sweep";
  p["sweep"] = spec_.name;
  p["trial"] = tag;
  p["launch_id"] = launch_id;
  p["date"] = now_iso8601();
  p["environment"] = environment_;
  if (engine != nullptr) p["environment"]["engine_cpu_isa"] = engine->cpu_isa();
  r["provenance"] = p;
  const std::string raw = (fs::path(store_.raw_dir(info["id"].get<std::string>())) / (w.name + ".r" + std::to_string(repeat) + ".requests.json")).string();
  write_file_atomic(raw, per_request.dump() + "\n");
  store_.write_record(r);
}

}  // namespace servetune::tuner
