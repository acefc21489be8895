// The sweep driver (see sweep_runner.h).
#include "tuner/sweep_runner.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "formats/gguf.h"
#include "loadgen/report.h"
#include "servetune/engine.h"
#include "tokenizer/tokenizer.h"
#include "tuner/measurement.h"
#include "tuner/launcher.h"
#include "tuner/plan.h"
#include "tuner/progress.h"
#include "tuner/results_store.h"
#include "tuner/server_command.h"
#include "tuner/server_process.h"
#include "tuner/space.h"
#include "tuner/strategy.h"

namespace servetune::tuner {
namespace fs = std::filesystem;
namespace {

constexpr int kChildFailed = 3;  // the candidate failed and its marker is written
constexpr int kChildError = 4;   // an error that stops the sweep (printed by the child)
constexpr int kChildLost = 5;    // the parent was gone before the child started

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// Files the sweep reads, checked before anything runs.
void check_inputs(const SweepSpec& spec) {
  const std::string& src = spec.source;
  if (spec.builtin() && !fs::exists(spec.target.model)) {
    throw_usage(src + ": target.model: " + spec.target.model + ": no such file or directory");
  }
  if (!spec.builtin()) {
    if (spec.target.tokenizer.empty()) throw_usage(src + ": target.tokenizer: an external target needs a tokenizer (.gguf or HF directory) for its datasets");
    if (!fs::exists(spec.target.tokenizer)) throw_usage(src + ": target.tokenizer: " + spec.target.tokenizer + ": no such file or directory");
    for (const auto& [name, server] : spec.target.servers) {
      if (spec.target.port == 0 && server.command.find("{port}") == std::string::npos) {
        throw_usage(src + ": target: the command of " + name + " has no {port}; put {port} in it or give target.port");
      }
    }
  }
  for (size_t i = 0; i < spec.workloads.size(); ++i) {
    const auto& d = spec.workloads[i].data;
    const std::string path = d.name == "sharegpt" && d.path.empty() ? datasets::default_sharegpt_path() : d.path;
    if ((d.name == "sharegpt" || d.name == "trace") && !fs::exists(path)) {
      throw_usage(src + ": workload " + spec.workloads[i].group + ": dataset file " + path +
                  " does not exist" + (d.path.empty() ? " (scripts/setup.sh fetches it)" : ""));
    }
  }
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (fs::is_directory(path)) return Tokenizer::from_hf_dir(path);
  GgufFile gguf(path);
  return Tokenizer::from_gguf(gguf);
}

nlohmann::ordered_json candidate_info(const Candidate& c, const SearchSpace& space, const SweepSpec& spec) {
  nlohmann::ordered_json j;
  j["id"] = c.id;
  j["label"] = c.label;
  j["settings"] = c.settings;
  j["full_settings"] = space.full_settings(c);
  j["engine"] = spec.builtin() ? std::string("builtin") : server_for(spec, space.full_settings(c)).name;
  if (!spec.builtin()) {
    const auto& server = server_for(spec, space.full_settings(c));
    if (!server.version.empty()) j["engine_version"] = server.version;
  }
  return j;
}

std::string run_summary(const Measurement& m) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%lld ok, %lld failed, %.1f tok/s total, TPOT %.1f ms",
                static_cast<long long>(m.metrics.completed), static_cast<long long>(m.metrics.failed),
                m.metrics.total_token_throughput, m.metrics.tpot_ms.mean);
  return buf;
}

// The measurement of one run on a launched candidate: the workload's traffic, every percentile metric a sweep's
// SLO may name, and the parts the session offers: the engine's statistics and this process's CPU time with the
// calibration (built-in: the engine runs in this process), or the server's /metrics counters (external).
MeasureOptions measure_options(const WorkloadSpec& w, const std::vector<double>& percentiles, Session& session) {
  MeasureOptions o;
  o.request_rate = w.request_rate;
  o.burstiness = w.burstiness;
  o.arrival_seed = w.data.seed;
  o.max_concurrency = w.max_concurrency.value_or(0);
  o.params.ignore_eos = w.ignore_eos;
  o.params.temperature = w.temperature;
  o.num_warmups = w.num_warmups;
  o.warmups = WarmupRequests::kCycle;
  o.percentiles = percentiles;
  o.percentile_metrics = loadgen::percentile_metric_names();
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

class Driver {
 public:
  Driver(const SweepSpec& spec, ResultsStore& store, const SweepOptions& o)
      : spec_(spec), store_(store), opts_(o), space_(spec), strategy_(Strategy::make(spec, space_)),
        launcher_(Launcher::make(spec, space_)), progress_(o.progress, strategy_->planned_runs()),
        environment_(loadgen::environment_json(SERVETUNE_VERSION)) {}

  SweepOutcome run() {
    SweepOutcome outcome;
    outcome.run_dir = store_.dir();
    tokenizer_ = load_tokenizer(spec_.builtin() ? spec_.target.model : spec_.target.tokenizer);
    ResultsTable table = ResultsTable::build(store_.records(), store_.trials());
    while (auto batch = strategy_->next(table)) {
      progress_.note("== " + batch->stage + ": " + std::to_string(batch->trials.size()) + " candidates");
      for (const Trial& t : batch->trials) {
        const size_t runs = t.workloads.size() * static_cast<size_t>(spec_.repeat);
        if (store_.trial(t.candidate.id, t.tag)) {
          ++outcome.trials_reused;
          progress_.skip_runs(runs);
          continue;
        }
        if (!t.candidate.skip_reason.empty()) {
          write_marker(t, "skipped", "", t.candidate.skip_reason, "", "");
          progress_.note(t.candidate.id + " (" + t.candidate.label + "): skipped: " + t.candidate.skip_reason);
          progress_.skip_runs(runs);
          ++outcome.skipped;
          continue;
        }
        if (!(spec_.builtin() ? run_trial_isolated(t) : run_trial(t))) ++outcome.failed;
        ++outcome.trials_run;
      }
      table = ResultsTable::build(store_.records(), store_.trials());
    }
    return outcome;
  }

 private:
  void write_marker(const Trial& t, const std::string& status, const std::string& failure, const std::string& reason,
                    const std::string& launch_id, const std::string& log, const std::string& command = "",
                    const std::string& started = "") {
    nlohmann::ordered_json m;
    m["candidate"] = t.candidate.id;
    m["tag"] = t.tag;
    nlohmann::ordered_json info = candidate_info(t.candidate, space_, spec_);
    if (!command.empty()) info["command"] = command;
    m["candidate_info"] = info;
    nlohmann::ordered_json ws = nlohmann::ordered_json::array();
    for (const auto& w : t.workloads) ws.push_back(w.name);
    m["workloads"] = ws;
    m["repeat"] = spec_.repeat;
    m["status"] = status;
    m["failure"] = failure;
    m["reason"] = reason;
    m["launch_id"] = launch_id;
    m["log"] = log;
    m["started"] = started;
    m["finished"] = now_iso8601();
    store_.write_trial(m);
  }

  // Repeat r samples with seed + r: repeats measure the same distribution without replaying the same prompts into
  // the prefix cache of the engine that served them a moment ago.
  static WorkloadSpec for_repeat(const WorkloadSpec& w, int repeat) {
    WorkloadSpec out = w;
    out.data.seed += static_cast<uint64_t>(repeat);
    return out;
  }

  const datasets::Workload& workload(const WorkloadSpec& w) {
    const std::string key = w.name + "#" + std::to_string(w.data.seed);
    auto it = workloads_.find(key);
    if (it == workloads_.end()) it = workloads_.emplace(key, datasets::load_workload(w.data, *tokenizer_)).first;
    return it->second;
  }

  void load_workloads(const Trial& t) {
    for (const auto& w : t.workloads) {
      for (int r = 0; r < spec_.repeat; ++r) workload(for_repeat(w, r));
    }
  }

  // A built-in candidate runs in a child process, so an engine that crashes or hangs fails that candidate, not the
  // sweep. The child writes the records and the marker; the parent writes the marker when the child dies. The
  // child dies with the parent (PR_SET_PDEATHSIG), so a killed sweep leaves nothing running.
  bool run_trial_isolated(const Trial& t) {
    load_workloads(t);
    const size_t runs = t.workloads.size() * static_cast<size_t>(spec_.repeat);
    const auto t0 = std::chrono::steady_clock::now();
    std::fflush(nullptr);
    progress_.before_fork();
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(kChildLost);
      progress_.after_fork_child();
      int code = kChildFailed;
      try {
        code = run_trial(t) ? 0 : kChildFailed;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "servetune: error: %s\n", e.what());
        code = kChildError;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    progress_.after_fork_parent();
    if (pid < 0) throw Error(ErrorKind::kIo, std::string("cannot fork for the candidate: ") + std::strerror(errno));
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
    progress_.child_done(runs, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (WIFEXITED(status) && WEXITSTATUS(status) == kChildError) throw Error(ErrorKind::kInternal, "the sweep stopped (see the error above)");
    if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == kChildFailed) && store_.trial(t.candidate.id, t.tag)) {
      return WEXITSTATUS(status) == 0;
    }
    std::string kind = kCrashed, why = "the engine process died (" + describe_wait_status(status) + ")";
    if (timed_out) {
      kind = kTimedOut;
      why = "the candidate ran longer than target.trial_timeout_s = " + format_duration(spec_.target.trial_timeout_s);
    } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      kind = kOom;
      why += "; SIGKILL from outside the sweep is usually the kernel's out-of-memory killer";
    }
    progress_.note(t.candidate.id + " (" + t.candidate.label + "): failed (" + kind + "): " + why);
    write_marker(t, "failed", kind, why, "", "", "", "");
    return false;
  }

  // Returns false when the candidate failed (the failure is recorded; the sweep goes on).
  bool run_trial(const Trial& t) {
    const std::string launch_id = new_launch_id();
    const std::string started = now_iso8601();
    std::vector<std::string> names;
    for (const auto& w : t.workloads) names.push_back(w.name);
    store_.discard_partial(t.candidate.id, names);
    // Datasets first: a bad dataset is the sweep's error, not the candidate's.
    load_workloads(t);
    const size_t runs = t.workloads.size() * static_cast<size_t>(spec_.repeat);
    progress_.trial_started(t.candidate.id, t.candidate.label, runs);
    std::string log, command;
    size_t done = 0;
    try {
      std::unique_ptr<Session> session = launcher_->start(t.candidate, store_.dir(), t.tag);
      log = session->log();
      command = session->command();
      nlohmann::ordered_json info = candidate_info(t.candidate, space_, spec_);
      if (!command.empty()) info["command"] = command;
      for (const auto& w : t.workloads) {
        for (int r = 0; r < spec_.repeat; ++r) {
          progress_.run_started(w.name, r);
          const WorkloadSpec wr = for_repeat(w, r);
          const MeasureOptions options = measure_options(wr, spec_.percentiles, *session);
          warm_up(session->client(), workload(wr), options);
          const Measurement m = measure(session->client(), workload(wr), options, *tokenizer_);
          session->check_alive(m.metrics.failed > 0 ? 3.0 : 0.0);
          nlohmann::ordered_json metrics, per_request;
          record_metrics(m, metrics, per_request);
          write_record(info, w, r, metrics, per_request, t.tag, launch_id, session->engine());
          progress_.run_finished(run_summary(m));
          ++done;
          if (m.metrics.completed == 0) {
            const loadgen::RequestOutput* first = m.first_failure();
            const bool timed_out = first != nullptr && first->failure == loadgen::RequestFailure::kTimedOut;
            throw LaunchFailure(timed_out ? kTimedOut : "requests_failed",
                                "every request of " + w.name + " failed: " +
                                    (first != nullptr ? loadgen::failure_reason(first->error) : std::string()));
          }
        }
      }
      session.reset();
    } catch (const LaunchFailure& f) {
      if (log.empty()) log = f.log();
      progress_.skip_runs(runs - done);
      progress_.note(t.candidate.id + " (" + t.candidate.label + "): failed (" + f.kind() + "): " + f.what());
      write_marker(t, "failed", f.kind(), f.what(), launch_id, log, command, started);
      return false;
    } catch (const std::bad_alloc&) {
      progress_.skip_runs(runs - done);
      progress_.note(t.candidate.id + " (" + t.candidate.label + "): failed (oom)");
      write_marker(t, "failed", kOom, "out of memory during the benchmark", launch_id, log, command, started);
      return false;
    }
    write_marker(t, "ok", "", "", launch_id, log, command, started);
    return true;
  }

  void write_record(const nlohmann::ordered_json& info, const WorkloadSpec& w, int repeat,
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

  const SweepSpec& spec_;
  ResultsStore& store_;
  const SweepOptions& opts_;
  SearchSpace space_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<Launcher> launcher_;
  Progress progress_;
  nlohmann::ordered_json environment_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::map<std::string, datasets::Workload> workloads_;
};

}  // namespace

std::string plan_text(const SweepSpec& spec) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* mem = open_memstream(&buf, &len);
  if (mem == nullptr) return "";
  print_plan(mem, spec);
  std::fclose(mem);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

SweepOutcome run_sweep(const SweepOptions& o) {
  if (o.file.empty() && o.resume_dir.empty()) throw_usage("servetune sweep needs a sweep file (or --resume RUN_DIR)");
  if (!o.resume_dir.empty() && !o.output_dir.empty()) throw_usage("--output and --resume are exclusive (--resume names the run folder)");
  SpecFile file;
  std::string text;
  std::unique_ptr<ResultsStore> store;
  if (!o.resume_dir.empty()) {
    store = std::make_unique<ResultsStore>(o.resume_dir);
    const nlohmann::ordered_json stored = store->sweep();
    file.path = stored.value("source", o.resume_dir + "/sweep.json");
    file.root = stored.at("document");
    if (!o.file.empty()) {
      const SpecFile given = load_spec_file(o.file);
      if (given.root != file.root) {
        throw_usage(o.file + ": differs from the sweep being resumed in " + o.resume_dir +
                    " (resume without the file, or start a new run)");
      }
    }
  } else {
    file = load_spec_file(o.file);
    text = read_text_file(o.file);
  }
  const SweepSpec spec = parse_sweep(file);
  if (o.dry_run) {
    print_plan(o.out, spec);
    return {};
  }
  check_inputs(spec);
  validate_plan(spec, SearchSpace(spec));
  if (!store) {
    const std::string dir = o.output_dir.empty() ? (fs::path("results") / spec.name / timestamp()).string() : o.output_dir;
    store = std::make_unique<ResultsStore>(dir);
    store->create(spec.document, o.file, text);
    write_file_atomic((fs::path(dir) / "plan.txt").string(), plan_text(spec));
  }
  std::fprintf(o.out, "servetune sweep %s: results in %s\n", spec.name.c_str(), store->dir().c_str());
  std::fflush(o.out);
  SweepOutcome outcome = Driver(spec, *store, o).run();
  outcome.run_dir = store->dir();
  return outcome;
}

}  // namespace servetune::tuner
