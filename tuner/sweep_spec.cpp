// Sweep-file parsing and validation (see sweep_spec.h): every key is read through Section, which rejects unknown
// keys with the list of known ones. Workloads are parsed in workload_spec.cpp, servers in server_command.cpp.
#include "tuner/sweep_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <regex>
#include <set>

#include "loadgen/report.h"
#include "servetune/collective_kind.h"
#include "servetune/engine_config.h"
#include "servetune/error.h"
#include "tuner/comm_cost.h"
#include "tuner/expr.h"
#include "tuner/spec_section.h"

namespace servetune::tuner {
namespace {

bool valid_name(const std::string& s) { return std::regex_match(s, std::regex("[A-Za-z0-9][A-Za-z0-9._-]*")); }

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string unknown_setting(const std::string& name) {
  return "unknown engine setting '" + name + "' (known: " + join(engine_config_keys()) + ")";
}

// A built-in engine setting's value, checked against the settings table (name, type, enum words).
void check_setting(const SpecFile& f, const std::string& path, const std::string& name,
                   const nlohmann::ordered_json& value) {
  if (find_engine_setting(name) == nullptr) f.fail(path, unknown_setting(name));
  try {
    check_engine_setting(name, value);
  } catch (const Error& e) {
    f.fail(path, e.what());
  }
}

void parse_target(const SpecFile& f, SweepSpec& spec) {
  Section t(f, f.root.at("target"), "target");
  TargetSpec& target = spec.target;
  target.engine = t.str("engine", "builtin");
  if (target.engine != "builtin" && target.engine != "external") t.fail("engine", "must be builtin or external, got '" + target.engine + "'");
  target.model = t.str("model", "", true);
  if (const auto* s = t.get("settings")) {
    if (!s->is_object()) t.fail("settings", "must be a mapping of setting -> value");
    target.settings = *s;
  }
  if (auto d = t.opt_int("devices", 1)) target.devices = *d;
  if (auto e = t.opt_int("num_experts", 1)) target.num_experts = *e;
  target.max_failed_fraction = t.dbl("max_failed_fraction", 0.01);
  target.flush_prefix_cache = t.boolean("flush_prefix_cache", true);
  if (!(target.max_failed_fraction >= 0.0 && target.max_failed_fraction <= 1.0)) {
    t.fail("max_failed_fraction", "must be between 0 and 1 (the fraction of a run's requests allowed to fail)");
  }
  if (target.engine == "builtin") {
    target.trial_timeout_s = t.dbl("trial_timeout_s", 0.0);
    if (target.trial_timeout_s < 0) t.fail("trial_timeout_s", "must be >= 0 (0: no limit)");
    t.done();
    if (target.settings.contains("model")) f.fail("target.settings.model", "give the model as target.model");
    for (const auto& [k, v] : target.settings.items()) check_setting(f, "target.settings." + k, k, v);
    return;
  }
  target.host = t.str("host", "127.0.0.1");
  target.port = static_cast<int>(t.int_in("port", 0, 0, 65535));
  target.tokenizer = t.str("tokenizer", "");
  const bool many = t.has("servers");
  if (many == t.has("command")) t.fail("", "an external target needs either command (one server) or servers (name -> server)");
  if (!many) {
    ServerSpec s = parse_server(f, t, "target", t.str("name", "server"));
    target.servers.emplace(s.name, s);
  } else {
    const auto* servers = t.get("servers");
    if (!servers->is_object() || servers->empty()) t.fail("servers", "must map server names to {command, ...}");
    for (const auto& [name, v] : servers->items()) {
      if (!valid_name(name)) f.fail("target.servers." + name, "server names use letters, digits, '.', '_' and '-'");
      Section s(f, v, "target.servers." + name);
      ServerSpec server = parse_server(f, s, "target.servers." + name, name);
      s.done();
      target.servers.emplace(name, server);
    }
  }
  t.done();
}

void parse_space(const SpecFile& f, SweepSpec& spec) {
  const auto it = f.root.find("space");
  if (it == f.root.end() || it->is_null()) return;
  if (!it->is_object()) f.fail("space", "must map each setting to a list of values");
  for (const auto& [name, values] : it->items()) {
    const std::string key = "space." + name;
    if (spec.builtin()) {
      if (name == "model") f.fail(key, "the model is target.model, not a swept setting");
      if (find_engine_setting(name) == nullptr) f.fail(key, unknown_setting(name));
    } else if (name == "server") {
      if (spec.target.servers.size() < 2) f.fail(key, "'server' chooses among target.servers, which needs two or more");
    }
    Dimension d;
    d.name = name;
    if (values.is_array()) {
      for (const auto& v : values) d.values.push_back(v);
    } else {
      d.values.push_back(values);
    }
    if (d.values.empty()) f.fail(key, "needs at least one value");
    for (size_t i = 0; i < d.values.size(); ++i) {
      if (d.values[i].is_array()) f.fail(key, "values must be scalars or mappings, not lists");
      for (size_t j = 0; j < i; ++j) {
        if (d.values[i] == d.values[j]) f.fail(key, "value " + d.values[i].dump() + " is listed twice");
      }
      if (name == "server" && (!d.values[i].is_string() || !spec.target.servers.count(d.values[i].get<std::string>()))) {
        f.fail(key, "value " + d.values[i].dump() + " is not one of target.servers");
      }
    }
    if (spec.builtin()) {
      for (const auto& v : d.values) check_setting(f, key, name, v);
    }
    spec.space.push_back(std::move(d));
  }
  if (!spec.builtin() && spec.target.servers.size() > 1 && !spec.dimension("server")) {
    f.fail("space", "target.servers lists several servers; add `server: [...]` to the space to choose among them");
  }
}

void parse_baseline(const SpecFile& f, SweepSpec& spec) {
  const auto it = f.root.find("baseline");
  nlohmann::ordered_json base = nlohmann::ordered_json::object();
  if (it != f.root.end() && !it->is_null()) {
    if (!it->is_object()) f.fail("baseline", "must map swept settings to one of their values");
    for (const auto& [k, v] : it->items()) {
      const Dimension* d = spec.dimension(k);
      if (d == nullptr) f.fail("baseline." + k, "'" + k + "' is not a key of space");
      if (std::find(d->values.begin(), d->values.end(), v) == d->values.end()) {
        f.fail("baseline." + k, "value " + v.dump() + " is not one of space." + k + "'s values");
      }
    }
    base = *it;
  }
  for (const Dimension& d : spec.space) {
    if (!base.contains(d.name)) base[d.name] = d.values.front();
  }
  spec.baseline = base;
}

void parse_strategy(const SpecFile& f, SweepSpec& spec) {
  if (!f.root.contains("strategy") || f.root.at("strategy").is_null()) return;
  Section s(f, f.root.at("strategy"), "strategy");
  StrategySpec& st = spec.strategy;
  st.kind = s.str("kind", "grid");
  if (st.kind == "grid") {
    s.done();
    return;
  }
  if (st.kind == "staged") {
    const auto* stages = s.get("stages");
    if (stages == nullptr || !stages->is_array() || stages->empty()) s.fail("stages", "staged needs a list of stages: [{name, dims: [...]}, ...]");
    std::set<std::string> seen;
    for (size_t i = 0; i < stages->size(); ++i) {
      const std::string path = "strategy.stages[" + std::to_string(i) + "]";
      Section g(f, (*stages)[i], path);
      StageSpec stage;
      stage.name = g.str("name", "", true);
      stage.dims = g.str_list("dims");
      if (stage.dims.empty()) g.fail("dims", "needs at least one setting");
      for (const auto& d : stage.dims) {
        if (!spec.dimension(d)) g.fail("dims", "'" + d + "' is not a key of space");
        if (!seen.insert(d).second) g.fail("dims", "'" + d + "' is in two stages");
      }
      g.done();
      st.stages.push_back(stage);
    }
    for (const Dimension& d : spec.space) {
      if (d.values.size() > 1 && !seen.count(d.name)) {
        s.fail("stages", "space." + d.name + " has several values but is in no stage");
      }
    }
  } else if (st.kind == "halving") {
    const auto* sp = s.get("screen_prompts");
    if (sp == nullptr) s.fail("screen_prompts", "halving needs screen_prompts: N (or a list of increasing N)");
    const auto list = sp->is_array() ? *sp : nlohmann::ordered_json::array({*sp});
    for (const auto& v : list) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1) s.fail("screen_prompts", "must be positive integers");
      if (!st.screen_prompts.empty() && v.get<int64_t>() <= st.screen_prompts.back()) s.fail("screen_prompts", "must increase");
      st.screen_prompts.push_back(v.get<int64_t>());
    }
    st.keep = s.dbl("keep", 0.5);
    if (!(st.keep > 0.0 && st.keep < 1.0)) s.fail("keep", "must be in (0, 1)");
  } else if (st.kind == "bayes") {
    st.budget = s.int_in("budget", 0, 2, 100000);
    if (st.budget == 0) s.fail("budget", "bayes needs budget: N (candidates to measure, 2 or more)");
    st.startup = s.int_in("startup", std::max<int64_t>(3, st.budget / 4), 1, 100000);
    if (st.startup > st.budget) s.fail("startup", "must not exceed budget (" + std::to_string(st.budget) + ")");
    st.seed = static_cast<uint64_t>(s.int_in("seed", 0, 0, INT64_MAX));
  } else {
    s.fail("kind", "must be grid, staged, halving or bayes, got '" + st.kind + "'");
  }
  s.done();
}

void parse_objective_and_slo(const SpecFile& f, SweepSpec& spec) {
  if (f.root.contains("objective") && !f.root.at("objective").is_null()) {
    Section o(f, f.root.at("objective"), "objective");
    spec.objective.kind = o.str("kind", "metric");
    spec.objective.workload = o.str("workload", "");
    const bool load_goal = spec.objective.kind == "max_load_under_slo";
    if (!load_goal && spec.objective.kind != "metric") f.fail("objective.kind", "must be metric or max_load_under_slo, got '" + spec.objective.kind + "'");
    if (load_goal && (o.get("metric") != nullptr || o.get("goal") != nullptr)) {
      f.fail("objective", "kind max_load_under_slo ranks by the highest load whose SLOs hold (metric offered_load, goal max); "
                          "metric and goal do not apply");
    }
    spec.objective.metric = load_goal ? "offered_load" : o.str("metric", "total_token_throughput");
    if (load_goal) spec.objective.tiebreak = "request_goodput";
    const std::string goal = o.str("goal", "");
    o.done();
    if (!is_known_metric(spec.objective.metric)) f.fail("objective.metric", "unknown metric '" + spec.objective.metric + "'");
    if (goal.empty()) {
      spec.objective.maximize = !lower_is_better(spec.objective.metric);
    } else if (goal == "max" || goal == "min") {
      spec.objective.maximize = goal == "max";
    } else {
      f.fail("objective.goal", "must be max or min");
    }
  }
  if (spec.objective.workload.empty()) {
    spec.objective.workload = spec.workloads.front().group;
  } else {
    bool found = false;
    for (const auto& w : spec.workloads) found = found || w.group == spec.objective.workload || w.name == spec.objective.workload;
    if (!found) f.fail("objective.workload", "no workload is named '" + spec.objective.workload + "'");
  }
  if (f.root.contains("slo") && !f.root.at("slo").is_null()) {
    if (!f.root.at("slo").is_object()) f.fail("slo", "must map metrics to upper bounds, e.g. {p99_tpot_ms: 50}");
    for (const auto& [k, v] : f.root.at("slo").items()) {
      if (!is_known_metric(k)) f.fail("slo." + k, "unknown metric '" + k + "'");
      if (!v.is_number() || v.get<double>() < 0) f.fail("slo." + k, "must be a non-negative number");
      spec.slo[k] = v.get<double>();
    }
  }
  if (spec.objective.kind == "max_load_under_slo") {
    if (spec.slo.empty()) f.fail("objective.kind", "max_load_under_slo needs slo: the bounds a load must meet");
    bool levels = false;
    for (const auto& w : spec.workloads) {
      if (w.group == spec.objective.workload || w.name == spec.objective.workload) levels = levels || w.search || w.name != w.group;
    }
    if (!levels) {
      f.fail("objective.workload", "max_load_under_slo needs workload '" + spec.objective.workload +
                                       "' to search its load (max_concurrency or request_rate: {search: [lo, hi]}) or list levels");
    }
  }
}

void collect_percentiles(SweepSpec& spec) {
  std::set<double> ps = {50.0, 90.0, 99.0};
  const std::regex pct("(?:first_turn_|later_turns_)?p([0-9]+(\\.[0-9]+)?)_[a-z0-9_]+_ms");
  auto add = [&](const std::string& key) {
    std::smatch m;
    if (std::regex_match(key, m, pct)) ps.insert(std::stod(m[1].str()));
  };
  add(spec.objective.metric);
  for (const auto& [k, v] : spec.slo) add(k);
  for (const auto& t : spec.check_tolerances) add(t.substr(0, t.find('=')));
  spec.percentiles.assign(ps.begin(), ps.end());
}

void check_constraints(const SpecFile& f, const SweepSpec& spec) {
  std::set<std::string> known = {"devices", "num_experts"};
  for (const auto& d : spec.space) known.insert(d.name);
  for (const auto& [k, v] : spec.target.settings.items()) known.insert(k);
  if (spec.builtin()) {
    for (const auto& k : engine_config_keys()) known.insert(k);
  }
  for (size_t i = 0; i < spec.constraints.size(); ++i) {
    const std::string key = "constraints[" + std::to_string(i) + "]";
    Expr e;
    try {
      e = Expr::parse(spec.constraints[i]);
    } catch (const Error& err) {
      f.fail(key, err.what());
    }
    for (const auto& name : e.names()) {
      std::string canon = name;
      bool ok = known.count(name) > 0;
      for (const auto& k : known) {
        std::string u = k;
        std::replace(u.begin(), u.end(), '-', '_');
        ok = ok || u == name;
      }
      if (!ok) f.fail(key, "'" + spec.constraints[i] + "' reads '" + name + "', which is not a setting (settings: " +
                               join(std::vector<std::string>(known.begin(), known.end())) + ")");
      if ((name == "devices" && !spec.target.devices) || (name == "num_experts" && !spec.target.num_experts)) {
        f.fail(key, "'" + spec.constraints[i] + "' reads '" + name + "'; give target." + name);
      }
    }
  }
}

}  // namespace

const Dimension* SweepSpec::dimension(const std::string& n) const {
  for (const auto& d : space) {
    if (d.name == n) return &d;
  }
  return nullptr;
}

const WorkloadSpec* SweepSpec::workload(const std::string& n) const {
  for (const auto& w : workloads) {
    if (w.name == n) return &w;
  }
  return nullptr;
}

std::vector<const WorkloadSpec*> SweepSpec::objective_workloads() const {
  std::vector<const WorkloadSpec*> out;
  if (const WorkloadSpec* w = workload(objective.workload); w != nullptr && w->group != objective.workload) return {w};
  for (const auto& w : workloads) {
    if (w.group == objective.workload) out.push_back(&w);
  }
  return out;
}

namespace {

// engine_comm_<kind>_(calls|bytes|seconds): the per-kind collective counters (measurement.cpp).
bool is_collective_metric(const std::string& key) {
  for (size_t k = 0; k < kCollectiveKinds; ++k) {
    const std::string prefix = std::string("engine_comm_") + collective_kind_name(static_cast<CollectiveKind>(k)) + "_";
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string rest = key.substr(prefix.size());
    if (rest == "calls" || rest == "bytes" || rest == "seconds") return true;
  }
  return false;
}

}  // namespace

loadgen::GoodputSlo goodput_slo_of(const std::map<std::string, double>& slo) {
  static const std::regex stat("(?:mean|median|p[0-9]+(?:\\.[0-9]+)?)_(ttft|tpot|e2el)_ms");
  loadgen::GoodputSlo g;
  for (const auto& [key, bound] : slo) {
    std::smatch m;
    if (!std::regex_match(key, m, stat)) continue;
    std::optional<double>& slot = m[1] == "ttft" ? g.ttft : m[1] == "tpot" ? g.tpot : g.e2el;
    slot = slot ? std::min(*slot, bound) : bound;
  }
  return g;
}

bool is_known_metric(const std::string& key) {
  static const std::set<std::string> plain = {
      "duration", "completed", "failed", "offered_load", "total_input_tokens", "total_output_tokens", "request_throughput",
      "request_goodput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
      "max_concurrent_requests", "process_cpu_s", "cpu_ms_per_token", "engine_steps", "engine_batched_tokens",
      "engine_mean_batch_tokens", "engine_mean_running", "engine_prompt_tokens", "engine_generation_tokens",
      "engine_preemptions", "engine_idle_batches", "engine_prefix_hit_tokens", "engine_prefix_cache_hit_rate", "engine_forward_seconds",
      "engine_comm_seconds", "engine_comm_wait_seconds", "engine_comm_ms_per_step", "engine_comm_fraction",
      "engine_comm_wait_fraction", "engine_kv_bytes_per_token", "engine_moe_expert_imbalance", "engine_moe_ep_imbalance", "calibration_ms",
      "calibrated_cpu_per_token", "perplexity", "perplexity_increase", "kl_vs_baseline", "kl_p99_vs_baseline",
      "top1_agreement_vs_baseline", "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
      "spec_decode_draft_tokens", "spec_decode_accepted_tokens",
      // multi-turn workloads (loadgen/session_metrics.h)
      "num_sessions", "completed_sessions", "mean_turns_per_session", "first_turn_completed", "later_turns_completed",
      "first_turn_cached_fraction", "later_turns_cached_fraction", "prefix_cache_hit_rate"};
  if (plain.count(key)) return true;
  if (is_collective_metric(key)) return true;
  // The summaries a tuner run records (trial_runner.cpp): one per --percentile-metrics name; for multi-turn
  // workloads also session times and the first / later turns' TTFT, TPOT and ITL.
  static const std::regex stat_key(
      "(mean|median|std|p[0-9]+(\\.[0-9]+)?)_(" + join(loadgen::percentile_metric_names(), "|") + "|session_time)_ms");
  static const std::regex turn_key("(first_turn|later_turns)_(mean|median|p[0-9]+(\\.[0-9]+)?)_(ttft|tpot|itl)_ms");
  return std::regex_match(key, stat_key) || std::regex_match(key, turn_key);
}

bool lower_is_better(const std::string& key) {
  return (key.size() > 3 && key.compare(key.size() - 3, 3, "_ms") == 0) || key == "failed" || key == "duration" ||
         key == "cpu_ms_per_token" || key == "calibrated_cpu_per_token" || key == "process_cpu_s" || key == "engine_preemptions" || key == "engine_idle_batches" || key == "engine_steps" ||
         key == "engine_forward_seconds" || key == "engine_comm_seconds" || key == "engine_comm_fraction" ||
         key == "engine_comm_wait_seconds" || key == "engine_comm_wait_fraction" || is_collective_metric(key) ||
         key == "perplexity" || key == "perplexity_increase" || key == "kl_vs_baseline" || key == "kl_p99_vs_baseline";
}

namespace {

// repeat: a count (1-100), `auto` ({min: 3, max: 10, width: 0.05}) or {min, max, width}.
void parse_repeat(const SpecFile& f, Section& top, SweepSpec& spec) {
  const nlohmann::ordered_json* r = top.get("repeat");
  if (r == nullptr || r->is_number()) {
    spec.repeat = spec.repeat_min = static_cast<int>(top.int_in("repeat", 1, 1, 100));
    return;
  }
  if (r->is_string()) {
    if (r->get<std::string>() != "auto") top.fail("repeat", "must be a count (1-100), auto, or {min, max, width}");
    spec.repeat_min = 3;
    spec.repeat = 10;
    spec.repeat_width = 0.05;
    return;
  }
  if (!r->is_object()) top.fail("repeat", "must be a count (1-100), auto, or {min, max, width}");
  Section rs(f, *r, top.key_path("repeat"));
  spec.repeat_min = static_cast<int>(rs.int_in("min", 3, 2, 100));
  spec.repeat = static_cast<int>(rs.int_in("max", 10, 2, 100));
  spec.repeat_width = rs.dbl("width", 0.05);
  rs.done();
  if (spec.repeat < spec.repeat_min) rs.fail("max", "must be at least min (" + std::to_string(spec.repeat_min) + ")");
  if (!(spec.repeat_width > 0.0 && spec.repeat_width < 1.0)) {
    rs.fail("width", "must be between 0 and 1 (the interval's half-width relative to the mean, e.g. 0.05)");
  }
}

}  // namespace

SweepSpec parse_sweep(const SpecFile& f) {
  SweepSpec spec;
  spec.source = f.path;
  spec.document = f.root;
  Section top(f, f.root, "");
  spec.name = top.str("name", "", true);
  if (!valid_name(spec.name)) top.fail("name", "use letters, digits, '.', '_' and '-' (it names the results folder)");
  spec.description = top.str("description", "");
  if (!top.has("target")) top.fail("target", "missing (engine: builtin | external, model: ...)");
  top.get("target");
  parse_target(f, spec);
  top.get("space");
  parse_space(f, spec);
  spec.constraints = top.str_list("constraints");
  top.get("baseline");
  parse_baseline(f, spec);
  top.get("strategy");
  parse_strategy(f, spec);
  const auto* w = top.get("workloads");
  if (w == nullptr || !w->is_array() || w->empty()) top.fail("workloads", "needs a list of workloads: [{name, dataset, ...}]");
  spec.workloads = parse_workloads(f, *w);
  top.get("objective");
  top.get("slo");
  parse_objective_and_slo(f, spec);
  for (const WorkloadSpec& workload : spec.workloads) {
    if (workload.search && spec.slo.empty()) {
      f.fail("slo", "workload '" + workload.group + "' searches its load for the highest level within the SLOs: give slo bounds, e.g. {p99_tpot_ms: 50}");
    }
  }
  if (const auto* a = top.get("accuracy")) {
    Section as(f, *a, "accuracy");
    AccuracySpec acc;
    acc.dataset = as.str("dataset", "", true);
    acc.num_texts = as.int_in("num_texts", 200, 1, 1'000'000);
    acc.seed = static_cast<uint64_t>(as.int_in("seed", 0, 0, INT64_MAX));
    acc.ctx = static_cast<int>(as.int_in("ctx", 256, 4, 1 << 20));
    acc.chunks = static_cast<int>(as.int_in("chunks", 4, 1, 1'000'000));
    if (spec.builtin() && as.has("prompt_logprobs")) {
      as.fail("prompt_logprobs", "applies to external servers (their top-K); the built-in engine's KL uses whole rows");
    }
    acc.prompt_logprobs = static_cast<int>(as.int_in("prompt_logprobs", 20, 1, 1'000'000));
    as.done();
    spec.accuracy = acc;  // its file is checked when the sweep runs (relative paths are from where it runs)
  }
  parse_repeat(f, top, spec);
  if (top.has("interconnects")) {
    spec.interconnects = top.str_list("interconnects");
    std::string known;
    for (const auto& l : interconnects()) known += (known.empty() ? "" : ", ") + l.name;
    if (spec.interconnects.empty()) top.fail("interconnects", "needs one or more of: " + known);
    for (const auto& name : spec.interconnects) {
      if (find_interconnect(name) == nullptr) top.fail("interconnects", "unknown interconnect '" + name + "' (one of: " + known + ")");
    }
  }
  if (const auto* c = top.get("check")) {
    Section cs(f, *c, "check");
    spec.check_tolerances = cs.str_list("tolerances");
    cs.done();
  }
  top.done();
  if (spec.strategy.kind == "halving") {
    for (int64_t n : spec.strategy.screen_prompts) {
      if (n >= spec.objective_workloads().front()->data.num_prompts) {
        f.fail("strategy.screen_prompts", "must be below the objective workload's num_prompts (" +
                                              std::to_string(spec.objective_workloads().front()->data.num_prompts) + ")");
      }
    }
  }
  check_constraints(f, spec);
  collect_percentiles(spec);
  return spec;
}

SweepSpec load_sweep(const std::string& path) { return parse_sweep(load_spec_file(path)); }

}  // namespace servetune::tuner
