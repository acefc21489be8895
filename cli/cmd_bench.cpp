// `servetune bench`: the load generator. Takes `vllm bench serve`'s flags, builds a workload (sharegpt, random,
// trace, prefix; sharegpt and random also as multi-turn sessions), sends it to the built-in engine in-process (--backend builtin, with the engine flags) or to an
// OpenAI-compatible server, and prints / saves the result with vLLM's block text and JSON keys.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <tuple>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "datasets/dataset.h"
#include "datasets/length_dist.h"
#include "engine_flags.h"
#include "loadgen/backends.h"
#include "loadgen/http_client.h"
#include "loadgen/inprocess_client.h"
#include "loadgen/report.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"
#include "tuner/measurement.h"
#include "tuner/results_store.h"

namespace servetune::cli {
namespace {

struct BenchOptions {
  EngineConfig engine;  // --model and, for --backend builtin, the engine settings
  std::string backend = "openai";
  std::string base_url;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint;
  std::string api_key;
  std::string served_model_name;
  std::string tokenizer;
  std::string label;
  datasets::DatasetOptions data;
  std::optional<int64_t> max_concurrency;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int64_t num_warmups = 0;
  std::vector<std::string> goodput;
  std::string percentile_metrics;
  std::string metric_percentiles = "99";
  bool save_result = false;
  bool save_detailed = false;
  std::string result_dir;
  std::string result_filename;
  std::vector<std::string> metadata;
  std::string expert_distribution_out;
  bool ignore_eos = false;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  double request_timeout = 6 * 3600.0;
  double think_time = 0.0;
  std::string think_time_dist = "fixed";
  std::string think_time_trace;
  CLI::App* cmd = nullptr;
};

bool given(const BenchOptions& o, const std::string& flag) { return o.cmd->count(flag) > 0; }

double parse_rate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "INF") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || !(v > 0.0)) throw_usage("--request-rate must be a number > 0 or inf, got '" + s + "'");
  return v;
}

// Python's str(float): "inf", "10.0", "2.5" (vLLM puts it in the result file name).
std::string py_float(double v) {
  if (std::isinf(v)) return "inf";
  if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v)) + ".0";
  return loadgen::percentile_word(v);
}

void check_flag_use(const BenchOptions& o) {
  const bool builtin = o.backend == "builtin";
  if (!builtin && !loadgen::is_http_backend(o.backend)) {
    throw_usage("--backend must be one of builtin, openai, openai-chat, vllm, sglang, llama.cpp; got '" + o.backend + "'");
  }
  if (builtin) {
    for (const char* f : {"--base-url", "--host", "--port", "--endpoint", "--api-key", "--served-model-name",
                          "--request-timeout"}) {
      if (given(o, f)) throw_usage(std::string(f) + " applies to HTTP backends, not --backend builtin");
    }
  } else {
    if (!o.expert_distribution_out.empty()) throw_usage("--expert-distribution-out reads the built-in engine's counters; use --backend builtin");
    reject_engine_flags(o.cmd, "it applies only to --backend builtin");
  }
  if (o.max_concurrency && *o.max_concurrency <= 0) throw_usage("--max-concurrency must be > 0");
  if (o.num_warmups < 0) throw_usage("--num-warmups must be >= 0");
  if (o.data.name == "trace" && given(o, "--request-rate")) {
    throw_usage("--dataset-name trace replays the trace's own arrival times; --request-rate does not apply "
                "(use --trace-time-scale)");
  }
  if (!o.data.multi_turn) {
    for (const char* f : {"--multi-turn-history", "--multi-turn-max-turns", "--multi-turn-turns",
                          "--multi-turn-prefix-len", "--multi-turn-system-len", "--multi-turn-tool-result-len",
                          "--multi-turn-turns-dist", "--multi-turn-input-len-dist", "--multi-turn-output-len-dist",
                          "--multi-turn-prefix-len-dist", "--think-time", "--think-time-dist", "--think-time-trace"}) {
      if (given(o, f)) throw_usage(std::string(f) + " needs --multi-turn");
    }
  }
  // A length distribution replaces its plain flag; both given would leave one unused.
  const std::tuple<const char*, const char*, const std::string*> replaces[] = {
      {"--multi-turn-turns-dist", "--multi-turn-turns", &o.data.multi_turn_turns_dist},
      {"--multi-turn-input-len-dist", "--random-input-len", &o.data.multi_turn_input_len_dist},
      {"--multi-turn-output-len-dist", "--random-output-len", &o.data.multi_turn_output_len_dist},
      {"--multi-turn-prefix-len-dist", "--multi-turn-prefix-len", &o.data.multi_turn_prefix_len_dist}};
  for (const auto& [dist, plain, text] : replaces) {
    if (given(o, dist) && given(o, plain)) throw_usage(std::string(dist) + " replaces " + plain + "; give one of them");
    if (!text->empty()) (void)datasets::parse_length_dist(*text, dist);
  }
  tuner::check_think_time(o.think_time, o.think_time_dist, o.think_time_trace);
  if (given(o, "--result-dir") || given(o, "--result-filename") || o.save_detailed) {
    if (!o.save_result) throw_usage("--result-dir / --result-filename / --save-detailed need --save-result");
  }
}

void print_dataset(const datasets::Workload& w) {
  const auto& in = w.info["input_len"];
  const auto& out = w.info["output_len"];
  if (w.sessions) {
    std::printf("Multi-turn: %lld sessions of %.2f turns on average (history: %s)\n",
                w.info["sessions"].get<long long>(), w.info["turns_per_session"]["mean"].get<double>(),
                w.history == "server" ? "the server's replies" : "the dataset's replies");
  }
  if (w.info.value("sessions_cut_at_length_limit", int64_t{0}) > 0) {
    std::printf("Note: %lld sessions end early, before a turn whose history exceeds --sharegpt-max-prompt-len or "
                "--sharegpt-max-total-len (%lld turns not sent; raise the limits to keep them)\n",
                w.info["sessions_cut_at_length_limit"].get<long long>(), w.info["turns_cut_at_length_limit"].get<long long>());
  }
  std::printf("Dataset %s: %zu requests; input tokens min %lld mean %.1f max %lld; output tokens min %lld mean %.1f max %lld\n",
              w.dataset_name.c_str(), w.requests.size(), in["min"].get<long long>(), in["mean"].get<double>(),
              in["max"].get<long long>(), out["min"].get<long long>(), out["mean"].get<double>(),
              out["max"].get<long long>());
  if (w.info.contains("prompts_off_target") && w.info["prompts_off_target"].get<int64_t>() > 0) {
    std::printf("Note: %lld prompts did not reach their target length after re-encoding (see dataset info)\n",
                w.info["prompts_off_target"].get<long long>());
  }
}

constexpr const char* kDefaultPercentileMetrics = "ttft,tpot,itl,client_lag,client_send_lag";

// The engine's assignments per MoE layer and expert (warm-ups included), in the form --init-expert-location reads.
void write_expert_distribution(const Engine& engine, const std::string& file) {
  const auto counts = engine.expert_distribution();
  if (counts.empty()) throw_usage("--expert-distribution-out: " + engine.config().model + " has no routed experts");
  nlohmann::ordered_json j;
  j["model"] = engine.config().model;
  j["logical_count"] = counts;
  std::ofstream out(file);
  if (!out) throw_io(file, "cannot write the expert distribution");
  out << j.dump() << "\n";
  if (!out) throw_io(file, "cannot write the expert distribution");
  std::printf("Saved the expert distribution to %s\n", file.c_str());
}

void run_bench(BenchOptions& o) {
  check_flag_use(o);
  const bool builtin = o.backend == "builtin";
  const double rate = parse_rate(o.request_rate);
  if (!(o.burstiness > 0.0)) throw_usage("--burstiness must be > 0");
  const std::vector<std::string> metrics = loadgen::parse_percentile_metrics(
      o.percentile_metrics.empty() ? kDefaultPercentileMetrics : o.percentile_metrics);
  const std::vector<double> percentiles = loadgen::parse_metric_percentiles(o.metric_percentiles);
  const loadgen::GoodputSlo slo = loadgen::parse_goodput(o.goodput);
  for (const std::string& kv : o.metadata) {
    if (kv.find('=') == std::string::npos) throw_usage("--metadata '" + kv + "' is not KEY=VALUE");
  }
  if (o.data.name == "random" || o.data.name == "trace") {
    if (!o.ignore_eos) std::printf("Note: --dataset-name %s sets ignore_eos so outputs reach their length (as vLLM does)\n", o.data.name.c_str());
    o.ignore_eos = true;
  }

  const std::string model_id = o.engine.model;
  const std::string tokenizer_id = o.tokenizer.empty() ? model_id : o.tokenizer;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> own_tokenizer;
  std::unique_ptr<loadgen::Client> client;
  std::string api_key = o.api_key;
  if (const char* k = std::getenv("OPENAI_API_KEY"); api_key.empty() && k != nullptr) api_key = k;
  std::string server_root = o.base_url.empty() ? "http://" + o.host + ":" + std::to_string(o.port) : o.base_url;
  while (!server_root.empty() && server_root.back() == '/') server_root.pop_back();
  if (builtin) {
    engine = std::make_unique<Engine>(o.engine);
    client = std::make_unique<loadgen::InProcessClient>(*engine);
  } else {
    loadgen::HttpClientOptions h;
    h.backend = o.backend;
    const std::string endpoint = o.endpoint.empty() ? loadgen::default_endpoint(o.backend) : o.endpoint;
    h.api_url = server_root + endpoint;
    h.model = o.served_model_name.empty() ? model_id : o.served_model_name;
    h.api_key = api_key;
    h.request_timeout_s = o.request_timeout;
    client = std::make_unique<loadgen::HttpClient>(h);
  }
  if (!builtin || !o.tokenizer.empty()) own_tokenizer = load_client_tokenizer(tokenizer_id, o.tokenizer.empty() ? "--model" : "--tokenizer");
  const Tokenizer& tokenizer = own_tokenizer ? *own_tokenizer : engine->tokenizer();

  const datasets::Workload workload = datasets::load_workload(o.data, tokenizer);
  print_dataset(workload);
  const size_t n = workload.requests.size();
  if (!builtin) {
    const long limit = loadgen::raise_open_file_limit();
    const int64_t peak = o.max_concurrency ? std::min<int64_t>(*o.max_concurrency, static_cast<int64_t>(n)) : static_cast<int64_t>(n);
    if (limit > 0 && peak + 64 > limit) {
      std::fprintf(stderr, "warning: the open-file limit is %ld; up to %lld connections may fail to open\n", limit,
                   static_cast<long long>(peak));
    }
  }

  tuner::MeasureOptions mo;
  mo.request_rate = rate;
  mo.burstiness = o.burstiness;
  mo.arrival_seed = o.data.seed;
  mo.max_concurrency = o.max_concurrency.value_or(0);
  mo.params = {o.ignore_eos, o.temperature, o.top_p, o.top_k};
  mo.num_warmups = o.num_warmups;
  mo.think_time_s = o.think_time;
  mo.think_time_dist = o.think_time_dist;
  mo.think_time_trace = o.think_time_trace;
  mo.warmups = tuner::WarmupRequests::kFirst;
  mo.percentiles = percentiles;
  mo.percentile_metrics = metrics;
  mo.slo = slo;
  mo.engine = engine.get();
  // An HTTP server's speculative-decoding counters, when it exposes vLLM's (servetune serve and vLLM do).
  if (!builtin) mo.server_metrics_url = server_root + "/metrics";
  mo.api_key = api_key;
  // CPU time only: the calibration would add keys to the result JSON, whose keys are vLLM's plus a fixed set.
  mo.process_cpu = true;
  if (o.num_warmups > 0) {
    std::printf("Warming up with %lld requests...\n", static_cast<long long>(o.num_warmups));
    std::fflush(stdout);
    const tuner::WarmupOutcome w = tuner::warm_up(*client, workload, mo);
    if (w.failed > 0) {
      std::fprintf(stderr, "warning: %lld of %lld warm-up requests failed: %s\n", static_cast<long long>(w.failed),
                   static_cast<long long>(w.sent), w.first_error.c_str());
    }
    std::printf("Warmup run completed.\n");
  }

  std::printf("Starting main benchmark run...\n");
  if (workload.timed) {
    std::printf("Replaying the trace's arrival times (time scale %g).\n", o.data.trace_time_scale);
  } else {
    std::printf("Traffic request rate: %s\n", py_float(rate).c_str());
    std::printf("Burstiness factor: %s (%s)\n", py_float(o.burstiness).c_str(), o.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
  }
  std::printf("Maximum request concurrency: %s\n", o.max_concurrency ? std::to_string(*o.max_concurrency).c_str() : "None");
  std::fflush(stdout);
  const tuner::Measurement m = tuner::measure(*client, workload, mo, tokenizer);
  loadgen::print_failures(stdout, m.run, m.metrics);
  loadgen::print_result_block(stdout, m.metrics, m.run.duration_s, m.report);
  std::fflush(stdout);
  if (!o.expert_distribution_out.empty()) write_expert_distribution(*engine, o.expert_distribution_out);

  if (!o.save_result) return;
  const std::string date = tuner::now_stamp();
  nlohmann::ordered_json j;
  j["date"] = date;
  j["endpoint_type"] = o.backend;
  j["backend"] = o.backend;
  j["label"] = o.label.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(o.label);
  j["model_id"] = model_id;
  j["tokenizer_id"] = tokenizer_id;
  j["num_prompts"] = o.data.num_prompts;
  for (const std::string& kv : o.metadata) j[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  j["request_rate"] = std::isinf(rate) ? nlohmann::ordered_json("inf") : nlohmann::ordered_json(rate);
  j["burstiness"] = o.burstiness;
  j["max_concurrency"] = o.max_concurrency ? nlohmann::ordered_json(*o.max_concurrency) : nlohmann::ordered_json();
  j.update(loadgen::metrics_json(m.metrics, m.run, m.report, o.save_detailed));
  j["dataset_name"] = workload.dataset_name;
  j["dataset_info"] = nlohmann::ordered_json::parse(workload.info.dump());
  j["num_warmups"] = o.num_warmups;
  j.update(tuner::engine_stats_json(m));  // built-in engine only
  j.update(tuner::cpu_json(m));           // process_cpu_s: this process during the measured run (engine included)
  j["environment"] = loadgen::environment_json(SERVETUNE_VERSION);
  if (builtin) {
    j["environment"]["engine_cpu_isa"] = engine->cpu_isa();
    j["engine_config"] = nlohmann::ordered_json(nlohmann::json(engine->config()));  // keys sorted, as before
  }

  const std::string base_model = model_id.substr(model_id.find_last_of('/') + 1);
  std::string file = o.result_filename;
  if (file.empty()) {
    const std::string conc = o.max_concurrency ? "-concurrency" + std::to_string(*o.max_concurrency) : "";
    file = (o.label.empty() ? o.backend : o.label) + "-" + py_float(m.report.request_rate) + "qps" + conc + "-" + base_model + "-" + date + ".json";
  }
  if (!o.result_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.result_dir, ec);
    if (ec) throw_io(o.result_dir, "cannot create the result directory: " + ec.message());
    file = (std::filesystem::path(o.result_dir) / file).string();
  }
  std::ofstream out(file);
  if (!out) throw_io(file, "cannot write the result file");
  out << j.dump() << "\n";
  if (!out) throw_io(file, "cannot write the result file");
  std::printf("Saved the result to %s\n", file.c_str());
}

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Benchmark the built-in engine or an OpenAI-compatible server (vllm bench serve's flags)");
  o->cmd = cmd;
  add_engine_flags(cmd, o->engine);
  auto& d = o->data;
  cmd->add_option("--backend", o->backend, "builtin | openai | openai-chat | vllm | sglang | llama.cpp")->capture_default_str();
  cmd->add_option("--base-url", o->base_url, "Server base URL (instead of --host/--port), e.g. http://10.0.0.2:8000");
  cmd->add_option("--host", o->host)->capture_default_str();
  cmd->add_option("--port", o->port)->capture_default_str();
  cmd->add_option("--endpoint", o->endpoint, "API path (default /v1/completions; /v1/chat/completions for openai-chat)");
  cmd->add_option("--api-key", o->api_key, "Bearer token (default: $OPENAI_API_KEY)");
  cmd->add_option("--served-model-name", o->served_model_name, "The \"model\" field sent (default: --model)");
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer for the dataset: .gguf or HF directory (default: --model)");
  cmd->add_option("--label", o->label, "Result label (default: the backend)");
  cmd->add_option("--request-timeout", o->request_timeout, "Seconds before one HTTP request fails")->capture_default_str();
  auto* g = "Dataset";
  cmd->add_option("--dataset-name", d.name, "sharegpt | random | trace | prefix")->capture_default_str()->group(g);
  cmd->add_option("--dataset-path", d.path,
                  "ShareGPT JSON (default: " + datasets::default_sharegpt_path() + ") or Mooncake-format JSONL trace")
      ->group(g);
  cmd->add_option("--num-prompts", d.num_prompts)->capture_default_str()->group(g);
  cmd->add_option("--seed", d.seed, "Seed for the dataset and the arrival process")->capture_default_str()->group(g);
  cmd->add_option("--random-input-len", d.random_input_len)->capture_default_str()->group(g);
  cmd->add_option("--random-output-len", d.random_output_len)->capture_default_str()->group(g);
  cmd->add_option("--random-range-ratio", d.random_range_ratio, "Length spread r (see --random-range-mode)")->capture_default_str()->group(g);
  cmd->add_option("--random-range-mode", d.random_range_mode, "vllm: [L(1-r), L(1+r)]; sglang: [L*r, L]")->capture_default_str()->group(g);
  cmd->add_option("--random-prefix-len", d.random_prefix_len,
                  "Random tokens shared by every prompt (--multi-turn: by every session's first message)")->capture_default_str()->group(g);
  cmd->add_option("--sharegpt-output-len", d.sharegpt_output_len, "max_tokens for every request (default: the reply's length)")->group(g);
  cmd->add_option("--sharegpt-min-len", d.sharegpt_min_len)->capture_default_str()->group(g);
  cmd->add_option("--sharegpt-max-prompt-len", d.sharegpt_max_prompt_len)->capture_default_str()->group(g);
  cmd->add_option("--sharegpt-max-total-len", d.sharegpt_max_total_len)->capture_default_str()->group(g);
  cmd->add_flag("--disable-shuffle", d.disable_shuffle, "Keep the ShareGPT file order")->group(g);
  cmd->add_flag("--no-oversample", d.no_oversample, "Send fewer requests when fewer pass the filters")->group(g);
  cmd->add_option("--trace-time-scale", d.trace_time_scale, "Multiply trace arrival offsets (0.5: twice as fast)")->capture_default_str()->group(g);
  cmd->add_option("--trace-block-size", d.trace_block_size, "Tokens per trace hash id")->capture_default_str()->group(g);
  cmd->add_flag("--multi-turn", d.multi_turn,
                "sharegpt / random as sessions: each turn sends the chat-templated history; --num-prompts counts sessions")
      ->group(g);
  cmd->add_option("--multi-turn-history", d.multi_turn_history,
                  "dataset: histories hold the dataset's replies; server: the replies the server gave this run")
      ->capture_default_str()->group(g);
  cmd->add_option("--multi-turn-max-turns", d.multi_turn_max_turns, "sharegpt: at most N turns (user messages) a session; 0: all")
      ->capture_default_str()->group(g);
  cmd->add_option("--multi-turn-turns", d.multi_turn_turns, "random: turns (user messages) a session")->capture_default_str()->group(g);
  cmd->add_option("--multi-turn-prefix-len", d.multi_turn_prefix_len,
                  "random: tokens of each session's own prefix in its first message (vLLM's prefix_num_tokens)")
      ->capture_default_str()->group(g);
  cmd->add_option("--multi-turn-system-len", d.multi_turn_system_len,
                  "random, agent-shaped: tokens of a system prompt (instructions, tool schema) every session shares")
      ->capture_default_str()->group(g);
  cmd->add_option("--multi-turn-tool-result-len", d.multi_turn_tool_result_len,
                  "random, agent-shaped: turns after the first are tool results of this many tokens (0: user messages)")
      ->capture_default_str()->group(g);
  const char* dist_help = "random: a distribution as vLLM's multi-turn config names it (uniform:min=A,max=B, constant:value=N, "
                          "zipf:alpha=A[,max=M], poisson:alpha=A[,max=M], lognormal:average=A[,median_ratio=R][,max=M] or "
                          "lognormal:mean=MU,sigma=S[,max=M]) for ";
  cmd->add_option("--multi-turn-turns-dist", d.multi_turn_turns_dist, std::string(dist_help) + "turns a session (replaces --multi-turn-turns)")->group(g);
  cmd->add_option("--multi-turn-input-len-dist", d.multi_turn_input_len_dist,
                  std::string(dist_help) + "tokens of each user message (replaces --random-input-len)")->group(g);
  cmd->add_option("--multi-turn-output-len-dist", d.multi_turn_output_len_dist,
                  std::string(dist_help) + "tokens of each reply (replaces --random-output-len)")->group(g);
  cmd->add_option("--multi-turn-prefix-len-dist", d.multi_turn_prefix_len_dist,
                  std::string(dist_help) + "tokens of each session's own prefix (replaces --multi-turn-prefix-len)")->group(g);
  cmd->add_option("--prefix-num-groups", d.prefix_num_groups)->capture_default_str()->group(g);
  cmd->add_option("--prefix-system-prompt-len", d.prefix_system_prompt_len)->capture_default_str()->group(g);
  cmd->add_option("--prefix-question-len", d.prefix_question_len)->capture_default_str()->group(g);
  cmd->add_option("--prefix-output-len", d.prefix_output_len)->capture_default_str()->group(g);
  auto* t = "Traffic and results";
  cmd->add_option("--max-concurrency", o->max_concurrency)->group(t);
  cmd->add_option("--request-rate", o->request_rate, "Requests per second, or inf")->capture_default_str()->group(t);
  cmd->add_option("--burstiness", o->burstiness, "Gamma shape of the arrival gaps (1: Poisson)")->capture_default_str()->group(t);
  cmd->add_option("--think-time", o->think_time, "--multi-turn: seconds between a reply and the session's next turn")
      ->capture_default_str()->group(t);
  cmd->add_option("--think-time-dist", o->think_time_dist,
                  "fixed | exponential (mean --think-time, seeded by --seed) | trace (drawn from --think-time-trace, "
                  "seeded) | trace-replay (its values in order)")
      ->capture_default_str()->group(t);
  cmd->add_option("--think-time-trace", o->think_time_trace, "--multi-turn: a file of think times, seconds, one a line")->group(t);
  cmd->add_option("--num-warmups", o->num_warmups, "Warm-up requests before the measured run")->capture_default_str()->group(t);
  cmd->add_option("--goodput", o->goodput, "SLOs as KEY:VALUE in ms (ttft, tpot, e2el)")->group(t);
  std::string metric_names;
  for (const std::string& n : loadgen::percentile_metric_names()) {
    metric_names += (metric_names.empty() ? "" : ", ") + n;
  }
  cmd->add_option("--percentile-metrics", o->percentile_metrics,
                  std::string("Default ") + kDefaultPercentileMetrics + "; any of " + metric_names +
                      ". client_lag: how late the client read events (over HTTP only from a server that stamps "
                      "them, as servetune_mock_openai does), client_send_lag: how late it sent requests")
      ->group(t);
  cmd->add_option("--metric-percentiles", o->metric_percentiles)->capture_default_str()->group(t);
  cmd->add_flag("--save-result", o->save_result, "Write the result JSON")->group(t);
  cmd->add_flag("--save-detailed", o->save_detailed, "Also write per-request arrays")->group(t);
  cmd->add_option("--result-dir", o->result_dir)->group(t);
  cmd->add_option("--result-filename", o->result_filename)->group(t);
  cmd->add_option("--metadata", o->metadata, "KEY=VALUE pairs stored in the result JSON")->group(t);
  cmd->add_option("--expert-distribution-out", o->expert_distribution_out,
                  "builtin, MoE models: write the assignments per MoE layer and expert (for --init-expert-location)")->group(t);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Generate max_tokens tokens regardless of EOS")->group(t);
  cmd->add_option("--temperature", o->temperature)->group(t);
  cmd->add_option("--top-p", o->top_p)->group(t);
  cmd->add_option("--top-k", o->top_k)->group(t);
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(40, add_bench_command);

}  // namespace servetune::cli
