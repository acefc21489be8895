// Sweep files: YAML and JSON read the same; defaults; concurrency levels expand; every bad file gives one message
// naming the file, the key (with its line) and the problem; the committed configs/ all parse.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "test_paths.h"
#include "tuner/command_line.h"
#include "tuner/sweep_spec.h"

namespace servetune::tuner {
namespace {

const char* kMinimal = R"(name: t
target: {engine: builtin, model: m.gguf}
space:
  max_running_requests: [8, 32]
workloads:
  - {name: short, dataset: random, input_len: 16, output_len: 4, num_prompts: 8}
)";

SweepSpec parse_spec(const std::string& text, const std::string& name = "test.yaml") { return parse_sweep(parse_spec_text(text, name)); }

std::string spec_error_of(const std::string& text, const std::string& name = "test.yaml") {
  try {
    parse_spec(text, name);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

void expect_error(const std::string& text, const std::vector<std::string>& parts) {
  const std::string msg = spec_error_of(text);
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(TunerSpec, MinimalFileAndDefaults) {
  const SweepSpec s = parse_spec(kMinimal);
  EXPECT_EQ(s.name, "t");
  EXPECT_TRUE(s.builtin());
  ASSERT_EQ(s.space.size(), 1u);
  EXPECT_EQ(s.space[0].values.size(), 2u);
  EXPECT_EQ(s.baseline["max_running_requests"], 8);
  EXPECT_EQ(s.strategy.kind, "grid");
  EXPECT_EQ(s.objective.workload, "short");
  EXPECT_EQ(s.objective.metric, "total_token_throughput");
  EXPECT_TRUE(s.objective.maximize);
  EXPECT_EQ(s.repeat, 1);
  ASSERT_EQ(s.workloads.size(), 1u);
  EXPECT_TRUE(s.workloads[0].ignore_eos);  // synthetic prompts generate their full length
  EXPECT_TRUE(std::isinf(s.workloads[0].request_rate));
  EXPECT_EQ(s.percentiles, (std::vector<double>{50, 90, 99}));
}

TEST(TunerSpec, JsonReadsLikeYaml) {
  const std::string json = R"({"name": "t", "target": {"engine": "builtin", "model": "m.gguf"},
    "space": {"max_running_requests": [8, 32]},
    "workloads": [{"name": "short", "dataset": "random", "input_len": 16, "output_len": 4, "num_prompts": 8}]})";
  const SweepSpec a = parse_spec(kMinimal), b = parse_spec(json, "test.json");
  EXPECT_EQ(a.document, b.document);
  EXPECT_EQ(a.workloads[0].to_json(), b.workloads[0].to_json());
}

TEST(TunerSpec, YamlScalarsFollowTheCoreSchema) {
  const SweepSpec s = parse_spec(R"(name: t
target: {engine: external, model: m, command: "srv --port {port} {flags}", tokenizer: tok}
space:
  flag: [true, "true", 1.5, 2, null, "x"]
workloads: [{name: w, dataset: random}]
)");
  const auto& v = s.space[0].values;
  EXPECT_TRUE(v[0].is_boolean());
  EXPECT_TRUE(v[1].is_string());
  EXPECT_TRUE(v[2].is_number_float());
  EXPECT_TRUE(v[3].is_number_integer());
  EXPECT_TRUE(v[4].is_null());
  EXPECT_EQ(v[5], "x");
}

TEST(TunerSpec, ConcurrencyAndRateListsExpandIntoLevels) {
  const SweepSpec s = parse_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads:
  - {name: load, dataset: random, max_concurrency: [1, 4, 16]}
  - {name: rate, dataset: random, request_rate: [2, inf]}
objective: {workload: load, metric: output_throughput}
slo: {p95_tpot_ms: 50}
)");
  ASSERT_EQ(s.workloads.size(), 5u);
  EXPECT_EQ(s.workloads[0].name, "load@c1");
  EXPECT_EQ(s.workloads[2].name, "load@c16");
  EXPECT_EQ(*s.workloads[2].max_concurrency, 16);
  EXPECT_EQ(s.workloads[2].group, "load");
  EXPECT_EQ(s.workloads[3].name, "rate@r2");
  EXPECT_EQ(s.workloads[4].name, "rate@rinf");
  EXPECT_EQ(s.objective_workloads().size(), 3u);
  EXPECT_EQ(s.percentiles, (std::vector<double>{50, 90, 95, 99}));  // p95 for the SLO
}

TEST(TunerSpec, MultiTurnWorkloadsAreSessionsWithThinkTime) {
  const SweepSpec s = parse_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads:
  - {name: chat, dataset: sharegpt, num_prompts: 4, multi_turn: {max_turns: 3, history: server, think_time: 0.5,
     think_time_dist: exponential}}
  - {name: synth, dataset: random, multi_turn: {turns: 6, prefix_len: 100, system_len: 300, tool_result_len: 20}}
  - {name: plain, dataset: random}
objective: {workload: chat, metric: later_turns_p95_ttft_ms}
slo: {p90_session_time_ms: 60000, first_turn_mean_ttft_ms: 5000}
)");
  ASSERT_EQ(s.workloads.size(), 3u);
  EXPECT_FALSE(s.objective.maximize);
  EXPECT_EQ(s.percentiles, (std::vector<double>{50, 90, 95, 99}));  // p95 for the objective
  const WorkloadSpec& chat = s.workloads[0];
  EXPECT_TRUE(chat.data.multi_turn);
  EXPECT_EQ(chat.data.multi_turn_max_turns, 3);
  EXPECT_EQ(chat.data.multi_turn_history, "server");
  EXPECT_DOUBLE_EQ(chat.think_time_s, 0.5);
  EXPECT_EQ(chat.think_time_dist, "exponential");
  EXPECT_EQ(chat.to_json()["multi_turn"]["max_turns"], 3);
  const WorkloadSpec& synth = s.workloads[1];
  EXPECT_EQ(synth.data.multi_turn_turns, 6);
  EXPECT_EQ(synth.data.multi_turn_prefix_len, 100);
  EXPECT_EQ(synth.data.multi_turn_system_len, 300);
  EXPECT_EQ(synth.data.multi_turn_tool_result_len, 20);
  EXPECT_EQ(synth.to_json()["multi_turn"]["tool_result_len"], 20);
  EXPECT_EQ(synth.data.multi_turn_history, "dataset");
  EXPECT_FALSE(s.workloads[2].data.multi_turn);
  EXPECT_FALSE(s.workloads[2].to_json().contains("multi_turn"));
  const std::string head = "name: t\ntarget: {engine: builtin, model: m.gguf}\nworkloads:\n  - {name: w, ";
  expect_error(head + "dataset: prefix, multi_turn: {}}\n", {"multi_turn", "does not apply to dataset prefix"});
  expect_error(head + "dataset: random, multi_turn: {max_turns: 2}}\n", {"multi_turn.max_turns", "sharegpt"});
  expect_error(head + "dataset: sharegpt, multi_turn: {turns: 2}}\n", {"multi_turn.turns", "random"});
  expect_error(head + "dataset: random, multi_turn: {history: client}}\n", {"multi_turn.history", "dataset or server"});
  expect_error(head + "dataset: random, multi_turn: {think_time_dist: weibull}}\n", {"multi_turn.think_time_dist"});
  expect_error(head + "dataset: random, multi_turn: {thinktime: 1}}\n", {"multi_turn.thinktime", "unknown key"});
  expect_error(head + "dataset: random, multi_turn: 3}\n", {"multi_turn", "mapping"});
}

// Length distributions in vLLM's JSON shape or the bench flag's text, and think times from a trace: parsed, checked
// with the key named, recorded in canonical text, and given back as the bench flags that reproduce the workload.
TEST(TunerSpec, MultiTurnLengthDistributionsAndThinkTimeTraces) {
  const std::string trace = testing::temp_file("spec_think.txt", "0.5\n1.5\n");
  const SweepSpec s = parse_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads:
  - {name: synth, dataset: random, output_len: 64,
     multi_turn: {turns_dist: {distribution: zipf, alpha: 2.0, max: 12}, input_len_dist: "lognormal:average=200,max=800",
                  prefix_len_dist: {distribution: uniform, min: 10, max: 50}, think_time_dist: trace-replay,
                  think_time_trace: )" + trace + R"(}}
)");
  const WorkloadSpec& w = s.workloads.at(0);
  EXPECT_EQ(w.data.multi_turn_turns_dist, "zipf:alpha=2,max=12");
  EXPECT_EQ(w.data.multi_turn_input_len_dist, "lognormal:average=200,median_ratio=0.85,max=800");
  EXPECT_EQ(w.data.multi_turn_prefix_len_dist, "uniform:min=10,max=50");
  EXPECT_EQ(w.data.multi_turn_output_len_dist, "");
  EXPECT_EQ(w.think_time_dist, "trace-replay");
  EXPECT_EQ(w.think_time_trace, trace);
  const nlohmann::ordered_json j = w.to_json();
  EXPECT_FALSE(j.contains("input_len"));  // the distribution replaces it
  EXPECT_EQ(j["output_len"], 64);
  EXPECT_FALSE(j["multi_turn"].contains("turns"));
  const std::string flags = bench_flags(j);
  for (const std::string& f : std::vector<std::string>{"--multi-turn-turns-dist zipf:alpha=2,max=12",
                               "--multi-turn-input-len-dist lognormal:average=200,median_ratio=0.85,max=800",
                               "--multi-turn-prefix-len-dist uniform:min=10,max=50", "--think-time-dist trace-replay",
                               "--think-time-trace " + trace, "--random-output-len 64"}) {
    EXPECT_NE(flags.find(f), std::string::npos) << f << " in " << flags;
  }
  EXPECT_EQ(flags.find("--random-input-len"), std::string::npos) << flags;
  EXPECT_EQ(flags.find("--multi-turn-turns "), std::string::npos) << flags;

  const std::string head = "name: t\ntarget: {engine: builtin, model: m.gguf}\nworkloads:\n  - {name: w, ";
  expect_error(head + "dataset: random, multi_turn: {turns_dist: {distribution: zipf, alpha: 0.5}}}\n",
               {"multi_turn.turns_dist", "zipf's alpha must be > 1"});
  expect_error(head + "dataset: random, multi_turn: {turns_dist: {alpha: 2}}}\n", {"multi_turn.turns_dist", "distribution"});
  expect_error(head + "dataset: random, multi_turn: {turns: 3, turns_dist: 4}}\n", {"multi_turn.turns_dist", "replaces turns"});
  expect_error(head + "dataset: random, input_len: 30, multi_turn: {input_len_dist: \"constant:value=3\"}}\n",
               {"multi_turn.input_len_dist", "replaces the workload's input_len"});
  expect_error(head + "dataset: sharegpt, multi_turn: {output_len_dist: 3}}\n", {"multi_turn.output_len_dist", "random"});
  expect_error(head + "dataset: random, multi_turn: {think_time_dist: trace}}\n",
               {"multi_turn.think_time_dist", "needs --think-time-trace"});
  expect_error(head + "dataset: random, multi_turn: {think_time_dist: trace, think_time_trace: /no/such/trace.txt}}\n",
               {"multi_turn.think_time_trace", "/no/such/trace.txt: no such file"});
  expect_error(head + "dataset: random, multi_turn: {think_time_trace: " + trace + "}}\n",
               {"multi_turn.think_time_trace", "needs --think-time-dist trace or trace-replay"});
}

// Every summary a tuner run records (one per --percentile-metrics name) can carry an SLO.
TEST(TunerSpec, SloMayNameEveryRecordedSummary) {
  for (const char* name : {"ttft", "e2el", "client_lag", "client_send_lag", "client_queue_time",
                           "e2el_including_client_queue", "per_token_itl"}) {
    SCOPED_TRACE(name);
    const std::string key = std::string("p99_") + name + "_ms";
    const SweepSpec s = parse_spec(std::string(kMinimal) + "slo: {" + key + ": 5}\n");
    EXPECT_EQ(s.slo.count(key), 1u);
  }
  EXPECT_FALSE(is_known_metric("p99_client_lags_ms"));
}

// repeat: a count, `auto`, or {min, max, width}; a count is min = max without a width (no early stop).
TEST(TunerSpec, RepeatIsACountOrAuto) {
  const SweepSpec fixed = parse_spec(std::string(kMinimal) + "repeat: 4\n");
  EXPECT_EQ(fixed.repeat, 4);
  EXPECT_EQ(fixed.repeat_min, 4);
  EXPECT_EQ(fixed.repeat_width, 0.0);
  const SweepSpec automatic = parse_spec(std::string(kMinimal) + "repeat: auto\n");
  EXPECT_EQ(automatic.repeat_min, 3);
  EXPECT_EQ(automatic.repeat, 10);
  EXPECT_DOUBLE_EQ(automatic.repeat_width, 0.05);
  const SweepSpec given = parse_spec(std::string(kMinimal) + "repeat: {min: 2, max: 6, width: 0.1}\n");
  EXPECT_EQ(given.repeat_min, 2);
  EXPECT_EQ(given.repeat, 6);
  EXPECT_DOUBLE_EQ(given.repeat_width, 0.1);
  expect_error(std::string(kMinimal) + "repeat: sometimes\n", {"repeat", "a count (1-100), auto, or {min, max, width}"});
  expect_error(std::string(kMinimal) + "repeat: {min: 5, max: 3}\n", {"repeat.max", "at least min (5)"});
  expect_error(std::string(kMinimal) + "repeat: {min: 1}\n", {"repeat.min"});
  expect_error(std::string(kMinimal) + "repeat: {width: 0}\n", {"repeat.width", "between 0 and 1"});
  expect_error(std::string(kMinimal) + "repeat: {maxx: 3}\n", {"repeat.maxx", "unknown key"});
}

// A load given as {search: [lo, hi], steps} is searched per candidate under the SLOs (one workload, levels at run
// time); it needs SLOs, a valid range, and no other listed or searched level.
TEST(TunerSpec, SearchedLoadNeedsSlosAndARange) {
  const SweepSpec s = parse_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads: [{name: load, dataset: random, max_concurrency: {search: [1, 64], steps: 6}}]
slo: {p99_tpot_ms: 50}
)");
  ASSERT_EQ(s.workloads.size(), 1u);
  EXPECT_EQ(s.workloads[0].name, "load");
  ASSERT_TRUE(s.workloads[0].search);
  EXPECT_TRUE(s.workloads[0].search->concurrency);
  EXPECT_EQ(s.workloads[0].search->hi, 64);
  EXPECT_EQ(s.workloads[0].search->steps, 6);
  EXPECT_EQ(max_runs(s.workloads, 2), 12u);
  const std::string head = "name: t\ntarget: {engine: builtin, model: m.gguf}\nworkloads: [{name: load, dataset: random, ";
  expect_error(head + "request_rate: {search: [1, 8]}}]\n", {"slo", "searches its load", "give slo bounds"});
  expect_error(head + "max_concurrency: {search: [8, 1]}}]\nslo: {p99_tpot_ms: 50}\n", {"max_concurrency.search", "0 < lo <= hi"});
  expect_error(head + "max_concurrency: {search: [1.5, 8]}}]\nslo: {p99_tpot_ms: 50}\n", {"integers"});
  expect_error(head + "max_concurrency: {search: [1, 8]}, request_rate: [1, 2]}]\nslo: {p99_tpot_ms: 50}\n",
               {"request_rate", "cannot list levels beside a searched one"});
  expect_error(head + "max_concurrency: {search: [1, 8]}, request_rate: {search: [1, 2]}}]\nslo: {p99_tpot_ms: 50}\n",
               {"only one of max_concurrency and request_rate"});
}

// objective: {kind: max_load_under_slo}: ranks by offered_load (max), goodput breaking ties; it needs SLOs and a
// workload whose load is searched or listed, and takes no metric or goal of its own.
TEST(TunerSpec, MaxLoadUnderSloObjective) {
  const std::string head = "name: t\ntarget: {engine: builtin, model: m.gguf}\nworkloads: [{name: load, dataset: random, ";
  const SweepSpec s = parse_spec(head + "request_rate: {search: [1, 16]}}]\nslo: {p99_ttft_ms: 2000, mean_tpot_ms: 50}\n"
                                        "objective: {kind: max_load_under_slo}\n");
  EXPECT_EQ(s.objective.kind, "max_load_under_slo");
  EXPECT_EQ(s.objective.metric, "offered_load");
  EXPECT_TRUE(s.objective.maximize);
  EXPECT_EQ(s.objective.tiebreak, "request_goodput");
  EXPECT_EQ(parse_spec(head + "max_concurrency: [1, 8, 32]}]\nslo: {mean_tpot_ms: 50}\nobjective: {kind: max_load_under_slo, workload: load}\n")
                .objective.metric, "offered_load");
  expect_error(head + "request_rate: {search: [1, 16]}}]\nslo: {mean_tpot_ms: 50}\nobjective: {kind: max_load_under_slo, metric: "
                      "request_goodput}\n", {"objective", "metric and goal do not apply"});
  expect_error(head + "max_concurrency: 8}]\nslo: {mean_tpot_ms: 50}\nobjective: {kind: max_load_under_slo}\n",
               {"objective.workload", "to search its load"});
  expect_error(head + "max_concurrency: [1, 8]}]\nobjective: {kind: max_load_under_slo}\n", {"objective.kind", "needs slo"});
  expect_error(head + "max_concurrency: [1, 8]}]\nobjective: {kind: fastest}\n", {"objective.kind", "metric or max_load_under_slo"});
  // The goodput measured at each level counts the requests within the SLOs' per-request bounds.
  const loadgen::GoodputSlo g = goodput_slo_of({{"p99_ttft_ms", 2000}, {"mean_tpot_ms", 50}, {"p90_tpot_ms", 40}, {"completed", 8}});
  EXPECT_EQ(g.ttft, 2000.0);
  EXPECT_EQ(g.tpot, 40.0);  // the tightest bound on the metric
  EXPECT_FALSE(g.e2el);
  EXPECT_TRUE(goodput_slo_of({{"failed", 0}}).empty());
}

TEST(TunerSpec, BadFilesNameFileKeyLineAndProblem) {
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf, max_failed_fraction: 1.5}
)", {"target.max_failed_fraction", "must be between 0 and 1"});
  expect_error(std::string(kMinimal) + "spacee: {}\n", {"test.yaml", "spacee (line 7)", "unknown key 'spacee'"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
space:
  max_batch: [1, 2]
workloads: [{name: w, dataset: random}]
)", {"test.yaml: space.max_batch (line 4)", "unknown engine setting 'max_batch'"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, "many"]}
workloads: [{name: w, dataset: random}]
)", {"space.max_running_requests", "wrong type"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
constraints: ["tp_size * gpus <= 8"]
workloads: [{name: w, dataset: random}]
)", {"constraints[0]", "'gpus'", "not a setting"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
constraints: ["tp_size *"]
workloads: [{name: w, dataset: random}]
)", {"test.yaml", "unexpected end of expression"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 32], schedule_policy: [fcfs, lpm]}
strategy: {kind: staged, stages: [{name: a, dims: [max_running_requests]}]}
workloads: [{name: w, dataset: random}]
)", {"strategy.stages", "schedule_policy has several values but is in no stage"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads: [{name: w, dataset: random}]
objective: {workload: nope}
)", {"objective.workload", "no workload is named 'nope'"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads: [{name: w, dataset: sharegpt, input_len: 5}]
)", {"workloads[0].input_len", "does not apply to dataset sharegpt"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads: [{name: w, dataset: random}, {name: w, dataset: random}]
)", {"workloads[1].name", "two workloads are named 'w'"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads: [{name: w, dataset: wiki}]
)", {"workloads[0].dataset", "sharegpt, random, trace or prefix"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads: [{name: w, dataset: random, max_concurrency: [4, 0]}]
)", {"max_concurrency", "positive integer"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
workloads: [{name: w, dataset: random}]
slo: {p99_latency: 5}
)", {"slo.p99_latency", "unknown metric"});
  expect_error("name: t\ntarget: {engine: builtin\n", {"test.yaml", "line", "not valid YAML"});
  expect_error(R"(name: t
target: {engine: external, model: m}
workloads: [{name: w, dataset: random}]
)", {"target", "either command"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf, port: 8000}
workloads: [{name: w, dataset: random}]
)", {"target.port", "unknown key 'port'"});
  expect_error(R"(name: "a b"
target: {engine: builtin, model: m.gguf}
workloads: [{name: w, dataset: random}]
)", {"name", "results folder"});
  expect_error(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 32]}
baseline: {max_running_requests: 16}
workloads: [{name: w, dataset: random}]
)", {"baseline.max_running_requests", "not one of"});
}

TEST(TunerSpec, CommittedConfigsParse) {
  const std::filesystem::path dir = servetune::testing::source_path("configs");
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    const SweepSpec s = load_sweep(e.path().string());
    EXPECT_FALSE(s.workloads.empty());
    ++n;
  }
  EXPECT_GE(n, 4);
}

}  // namespace
}  // namespace servetune::tuner
