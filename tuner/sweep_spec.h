// The sweep file, parsed and validated: target (built-in engine or external server command), search space,
// constraints, strategy, workloads (with max_concurrency / request_rate lists expanded into levels), objective,
// SLOs, repeats. Everything that can be checked without running is checked here, with one message naming the
// file, the key and the problem (Error(kUsage), exit code 2).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/dataset.h"
#include "loadgen/metrics.h"
#include "tuner/spec_file.h"

namespace servetune::tuner {

struct WorkloadSpec {
  std::string name;   // unique; "<group>@c8" for an expanded concurrency level
  std::string group;  // the workload's name in the sweep file
  datasets::DatasetOptions data;
  double request_rate = 0.0;  // +inf: all requests at t = 0
  double burstiness = 1.0;
  std::optional<int64_t> max_concurrency;
  int64_t num_warmups = 0;
  bool ignore_eos = false;
  std::optional<double> temperature;
  // multi_turn (data.multi_turn): the wait between a reply and the session's next turn (think_time.h).
  double think_time_s = 0.0;
  std::string think_time_dist = "fixed";
  std::string think_time_trace;
  // SLA search (`max_concurrency` or `request_rate` given as {search: [lo, hi], steps}): each candidate measures the
  // levels a LoadSearch (load_search.h) asks for, the highest whose SLOs hold being its best feasible level; the
  // records are named as list levels are ("<group>@c8", "<group>@r2.5").
  struct Search {
    bool concurrency = false;
    double lo = 0.0;
    double hi = 0.0;
    int steps = 8;
  };
  std::optional<Search> search;

  // The record's description of the workload: dataset parameters, traffic shape, group and level.
  nlohmann::ordered_json to_json() const;
};

// Runs a trial of these workloads takes at most: `repeat` per workload, steps x repeat for a searched one.
size_t max_runs(const std::vector<WorkloadSpec>& workloads, int repeat);

// How one external server is launched and how candidate settings become its flags.
struct ServerSpec {
  std::string name;     // label in reports ("vllm", "sglang", ...)
  std::string version;  // informational
  std::string command;  // shell command with {model} {port} {host} {flags}
  std::string health = "/health";
  // POSTed before each measured run when target.flush_prefix_cache (SGLang /flush_cache, vLLM /reset_prefix_cache, which
  // needs VLLM_SERVER_DEV_MODE=1); "": the server's prefix cache stays warm between runs.
  std::string flush_cache;
  std::string backend = "openai";  // load-generator backend
  std::string endpoint;            // default: the backend's
  std::string served_model_name;   // default: target.model
  std::map<std::string, std::string> env;
  // setting -> "--flag {}" template, null (the server has no such setting), or {value: template}.
  nlohmann::ordered_json flags = nlohmann::ordered_json::object();
  double startup_timeout_s = 900.0;
  double stop_timeout_s = 30.0;
  double request_timeout_s = 3600.0;
};

struct TargetSpec {
  std::string engine = "builtin";  // builtin | external
  std::string model;
  nlohmann::ordered_json settings = nlohmann::ordered_json::object();  // fixed settings / flags
  // external
  std::map<std::string, ServerSpec> servers;  // one entry, or several chosen by the `server` setting
  std::string host = "127.0.0.1";
  int port = 0;                               // 0: a free port per launch
  std::string tokenizer;                      // .gguf or HF directory for the datasets
  double trial_timeout_s = 0.0;               // builtin: wall-clock limit of one candidate's trial (0: none)
  double max_failed_fraction = 0.01;          // a run with more failed requests than this fails the trial
  // Empty the prefix cache before each measured run, after its warm-up, so no run (or load level) starts with the
  // previous one's prompts cached: the built-in engine always, an external server when its flush_cache path is set.
  bool flush_prefix_cache = true;
  // validity rules (both kinds)
  std::optional<int64_t> devices;             // tp_size * dp_size must not exceed it
  std::optional<int64_t> num_experts;         // ep_size must divide it
};

struct Dimension {
  std::string name;
  std::vector<nlohmann::ordered_json> values;
};

struct StageSpec {
  std::string name;
  std::vector<std::string> dims;
};

struct StrategySpec {
  std::string kind = "grid";  // grid | staged | halving | bayes
  std::vector<StageSpec> stages;           // staged
  std::vector<int64_t> screen_prompts;     // halving: prompts per screening rung, increasing
  double keep = 0.5;                       // halving: fraction kept after each rung
  int64_t budget = 0;                      // bayes: candidates measured in all (the startup ones included)
  int64_t startup = 0;                     // bayes: candidates drawn at random before the model guides (0: budget / 4, at least 3)
  uint64_t seed = 0;                       // bayes: the draws (same seed and results, same candidates)
};

// `accuracy:` — the text every candidate is scored on (perplexity, KL against the baseline candidate): the built-in
// engine's whole logits rows, or an external server's top-K prompt_logprobs.
struct AccuracySpec {
  std::string dataset;  // a plain text file, sharegpt, or a ShareGPT .json (loadgen::perplexity_text)
  int64_t num_texts = 200;
  uint64_t seed = 0;
  int ctx = 256;
  int chunks = 4;
  int prompt_logprobs = 20;  // external servers: K, the top log-probabilities per position (vLLM's default maximum)
};

struct ObjectiveSpec {
  // metric: the best feasible level's `metric`; max_load_under_slo: the highest load (offered_load: rate, or
  // concurrency) whose SLOs hold, ties broken by the goodput there
  std::string kind = "metric";
  std::string workload;  // a workload group (its best feasible level counts) or an expanded name
  std::string metric = "total_token_throughput";
  bool maximize = true;
  std::string tiebreak;  // a metric ranking equal values (higher is better)
};

struct SweepSpec {
  std::string name;
  std::string description;
  std::string source;  // the file it came from
  TargetSpec target;
  std::vector<Dimension> space;
  std::vector<std::string> constraints;
  nlohmann::ordered_json baseline = nlohmann::ordered_json::object();  // dim -> value (default: first values)
  StrategySpec strategy;
  std::vector<WorkloadSpec> workloads;  // expanded, in file order
  std::optional<AccuracySpec> accuracy;
  ObjectiveSpec objective;
  std::map<std::string, double> slo;    // metric -> upper bound (latencies, ms)
  // Runs of each workload per candidate: `repeat` of them; with `repeat: auto` (repeat_width > 0) at least repeat_min
  // and at most `repeat`, stopping once the 95% interval of the objective metric's mean is within +-repeat_width of
  // the mean (relative).
  int repeat = 1;
  int repeat_min = 1;
  double repeat_width = 0.0;
  std::vector<std::string> check_tolerances;  // `servetune check` defaults ("total_output_tokens=0", ...)
  std::vector<std::string> interconnects = {"nvlink4", "400gbe"};  // the links --dry-run's comm cost is priced on
  std::vector<double> percentiles;            // computed for every run (50, 90, 99 + those named above)
  nlohmann::ordered_json document;            // the file's content as JSON (stored as sweep.json)

  bool builtin() const { return target.engine == "builtin"; }
  const Dimension* dimension(const std::string& name) const;
  const WorkloadSpec* workload(const std::string& name) const;
  std::vector<const WorkloadSpec*> objective_workloads() const;  // the objective's group, or the one workload
};

SweepSpec parse_sweep(const SpecFile& file);
SweepSpec load_sweep(const std::string& path);

// Metric keys a sweep file may name (objective, slo): vLLM's result keys and servetune's additions.
bool is_known_metric(const std::string& key);
// The per-request goodput bounds a sweep's SLOs imply: a request counts toward request_goodput when its own TTFT,
// TPOT and E2E latency are within the sweep's tightest bound on any statistic of that metric (mean, median, pNN).
loadgen::GoodputSlo goodput_slo_of(const std::map<std::string, double>& slo);
// True for metrics where lower is better (latencies, failures, CPU time per token).
bool lower_is_better(const std::string& key);

}  // namespace servetune::tuner
