// Workloads of a sweep file: dataset, size, traffic shape; a list under max_concurrency or request_rate expands
// into one workload per level ("<name>@c8", "<name>@r2.5") sharing the group name.
#include <cmath>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include "datasets/length_dist.h"
#include "servetune/error.h"
#include "tuner/spec_section.h"
#include "tuner/think_time.h"

namespace servetune::tuner {
namespace {

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::vector<nlohmann::ordered_json> levels(const nlohmann::ordered_json* v) {
  if (v == nullptr) return {nullptr};
  if (v->is_array()) {
    if (v->empty()) return {};
    return std::vector<nlohmann::ordered_json>(v->begin(), v->end());
  }
  return {*v};
}

double parse_rate(const Section& s, const nlohmann::ordered_json& v) {
  if (v.is_null()) return std::numeric_limits<double>::infinity();
  if (v.is_string() && (v == "inf" || v == "Inf")) return std::numeric_limits<double>::infinity();
  if (v.is_number() && v.get<double>() > 0) return v.get<double>();
  s.fail("request_rate", "must be a number > 0 or inf (or a list of them), got " + v.dump());
}

// A length distribution key of multi_turn: the CLI text ("zipf:alpha=2,max=20") or vLLM's JSON shape
// ({distribution: zipf, alpha: 2, max: 20}); returns its canonical text, "" when absent.
std::string length_dist(Section& s, const std::string& key) {
  const nlohmann::ordered_json* v = s.get(key);
  if (v == nullptr) return "";
  std::string text;
  if (v->is_string()) {
    text = v->get<std::string>();
  } else if (v->is_number_integer()) {
    text = v->dump();
  } else if (v->is_object() && v->contains("distribution") && (*v)["distribution"].is_string()) {
    text = (*v)["distribution"].get<std::string>() + ":";
    for (const auto& [k, x] : v->items()) {
      if (k == "distribution") continue;
      if (!x.is_number()) s.fail(key, "'" + k + "' must be a number, got " + x.dump());
      text += (text.back() == ':' ? "" : ",") + k + "=" + x.dump();
    }
  } else {
    s.fail(key, "must be a distribution: {distribution: NAME, ...} as vLLM's multi-turn config or \"NAME:KEY=VALUE,...\"");
  }
  try {
    return datasets::parse_length_dist(text, "").text();
  } catch (const Error& e) {
    s.fail(key, e.what());
  }
}

// `multi_turn: {history, max_turns (sharegpt), turns, prefix_len, system_len, tool_result_len and the *_dist length
// distributions (random), think_time, think_time_dist, think_time_trace}`: the dataset as sessions (bench
// --multi-turn); an empty mapping takes every default.
void parse_multi_turn(const SpecFile& f, const nlohmann::ordered_json& j, const std::string& path, WorkloadSpec& w,
                      const Section& workload) {
  if (!j.is_object()) f.fail(path, "must be a mapping of multi-turn options ({} for the defaults)");
  Section s(f, j, path);
  auto& d = w.data;
  d.multi_turn = true;
  d.multi_turn_history = s.str("history", "dataset");
  if (d.multi_turn_history != "dataset" && d.multi_turn_history != "server") s.fail("history", "must be dataset or server");
  if (d.name == "sharegpt") {
    d.multi_turn_max_turns = s.int_in("max_turns", 0, 0, 1'000'000);
    for (const char* key : {"turns", "prefix_len", "system_len", "tool_result_len", "turns_dist", "input_len_dist",
                            "output_len_dist", "prefix_len_dist"}) {
      if (s.has(key)) s.fail(key, "applies to dataset random");
    }
  } else {
    d.multi_turn_turns = s.int_in("turns", 4, 1, 1'000'000);
    d.multi_turn_prefix_len = s.int_in("prefix_len", 0, 0, 10'000'000);
    d.multi_turn_system_len = s.int_in("system_len", 0, 0, 10'000'000);
    d.multi_turn_tool_result_len = s.int_in("tool_result_len", 0, 0, 10'000'000);
    if (s.has("max_turns")) s.fail("max_turns", "applies to dataset sharegpt (random takes turns)");
    // Each distribution replaces one plain key; giving both would leave one unused.
    const std::pair<const char*, const char*> plain[] = {{"turns_dist", "turns"}, {"prefix_len_dist", "prefix_len"}};
    for (const auto& [dist, key] : plain) {
      if (s.has(dist) && s.has(key)) s.fail(dist, std::string("replaces ") + key + "; give one of them");
    }
    for (const char* key : {"input_len", "output_len"}) {
      if (s.has(std::string(key) + "_dist") && workload.has(key)) {
        s.fail(std::string(key) + "_dist", std::string("replaces the workload's ") + key + "; give one of them");
      }
    }
    d.multi_turn_turns_dist = length_dist(s, "turns_dist");
    d.multi_turn_input_len_dist = length_dist(s, "input_len_dist");
    d.multi_turn_output_len_dist = length_dist(s, "output_len_dist");
    d.multi_turn_prefix_len_dist = length_dist(s, "prefix_len_dist");
  }
  w.think_time_s = s.dbl("think_time", 0.0);
  w.think_time_dist = s.str("think_time_dist", "fixed");
  w.think_time_trace = s.str("think_time_trace", "");
  try {
    check_think_time(w.think_time_s, w.think_time_dist, w.think_time_trace);
  } catch (const Error& e) {
    // The message opens with the bench flag at fault; name the key it maps to. Relative trace paths are from where
    // the sweep runs.
    const std::string m = e.what();
    s.fail(m.rfind("--think-time-trace", 0) == 0 ? "think_time_trace" : m.rfind("--think-time-dist", 0) == 0 ? "think_time_dist" : "think_time", m);
  }
  s.done();
}

WorkloadSpec parse_one(const SpecFile& f, const nlohmann::ordered_json& j, const std::string& path,
                       std::vector<WorkloadSpec>& out) {
  Section s(f, j, path);
  WorkloadSpec w;
  w.group = s.str("name", "", true);
  if (!std::regex_match(w.group, std::regex("[A-Za-z0-9][A-Za-z0-9._-]*"))) {
    s.fail("name", "use letters, digits, '.', '_' and '-' (it names result files)");
  }
  auto& d = w.data;
  d.name = s.str("dataset", "", true);
  d.num_prompts = s.int_in("num_prompts", 100, 1, 10'000'000);
  d.seed = static_cast<uint64_t>(s.int_in("seed", 0, 0, INT64_MAX));
  w.num_warmups = s.int_in("num_warmups", 0, 0, 100000);
  w.burstiness = s.dbl("burstiness", 1.0);
  if (!(w.burstiness > 0)) s.fail("burstiness", "must be > 0");
  w.temperature = s.opt_dbl("temperature");
  const std::set<std::string> per_dataset_keys = {"dataset_path", "input_len", "output_len", "range_ratio", "range_mode",
                                                  "prefix_len", "min_len", "max_prompt_len", "max_total_len",
                                                  "disable_shuffle", "time_scale", "block_size", "num_groups",
                                                  "system_prompt_len", "question_len", "multi_turn"};
  std::set<std::string> allowed;
  if (d.name == "random") {
    d.random_input_len = s.int_in("input_len", 1024, 1, 10'000'000);
    d.random_output_len = s.int_in("output_len", 128, 1, 10'000'000);
    d.random_range_ratio = s.dbl("range_ratio", 0.0);
    d.random_range_mode = s.str("range_mode", "vllm");
    if (d.random_range_mode != "vllm" && d.random_range_mode != "sglang") s.fail("range_mode", "must be vllm or sglang");
    d.random_prefix_len = s.int_in("prefix_len", 0, 0, 10'000'000);
    allowed = {"input_len", "output_len", "range_ratio", "range_mode", "prefix_len", "multi_turn"};
  } else if (d.name == "sharegpt") {
    d.path = s.str("dataset_path", "");
    if (const auto o = s.opt_int("output_len", 1)) d.sharegpt_output_len = *o;
    d.sharegpt_min_len = s.int_in("min_len", 4, 0, 10'000'000);
    d.sharegpt_max_prompt_len = s.int_in("max_prompt_len", 1024, 1, 10'000'000);
    d.sharegpt_max_total_len = s.int_in("max_total_len", 2048, 1, 10'000'000);
    d.disable_shuffle = s.boolean("disable_shuffle", false);
    allowed = {"dataset_path", "output_len", "min_len", "max_prompt_len", "max_total_len", "disable_shuffle", "multi_turn"};
  } else if (d.name == "trace") {
    d.path = s.str("dataset_path", "", true);
    d.trace_time_scale = s.dbl("time_scale", 1.0);
    d.trace_block_size = s.int_in("block_size", 512, 1, 1'000'000);
    allowed = {"dataset_path", "time_scale", "block_size"};
  } else if (d.name == "prefix") {
    d.prefix_num_groups = s.int_in("num_groups", 64, 1, 1'000'000);
    d.prefix_system_prompt_len = s.int_in("system_prompt_len", 2048, 1, 10'000'000);
    d.prefix_question_len = s.int_in("question_len", 128, 1, 10'000'000);
    d.prefix_output_len = s.int_in("output_len", 256, 1, 10'000'000);
    allowed = {"num_groups", "system_prompt_len", "question_len", "output_len"};
  } else {
    s.fail("dataset", "must be sharegpt, random, trace or prefix, got '" + d.name + "'");
  }
  for (const auto& k : per_dataset_keys) {
    if (!allowed.count(k) && s.has(k)) s.fail(k, "does not apply to dataset " + d.name);
  }
  if (const nlohmann::ordered_json* mt = s.get("multi_turn")) parse_multi_turn(f, *mt, s.key_path("multi_turn"), w, s);
  for (const auto& k : per_dataset_keys) s.get(k);
  // As `servetune bench` (and vLLM): synthetic prompts generate their full length.
  w.ignore_eos = s.boolean("ignore_eos", d.name != "sharegpt");
  for (const char* key : {"max_concurrency", "request_rate"}) {
    const nlohmann::ordered_json* v = s.get(key);
    if (v == nullptr || !v->is_object()) continue;
    if (w.search) s.fail(key, "only one of max_concurrency and request_rate can be searched");
    Section ss(f, *v, s.key_path(key));
    const nlohmann::ordered_json* range = ss.get("search");
    if (range == nullptr || !range->is_array() || range->size() != 2 || !(*range)[0].is_number() || !(*range)[1].is_number() ||
        !((*range)[0].get<double>() > 0) || (*range)[1].get<double>() < (*range)[0].get<double>()) {
      ss.fail("search", "needs [lo, hi] with 0 < lo <= hi (the range of levels to search)");
    }
    WorkloadSpec::Search search;
    search.concurrency = std::string(key) == "max_concurrency";
    search.lo = (*range)[0].get<double>();
    search.hi = (*range)[1].get<double>();
    if (search.concurrency && (std::floor(search.lo) != search.lo || std::floor(search.hi) != search.hi)) {
      ss.fail("search", "concurrency levels are integers");
    }
    search.steps = static_cast<int>(ss.int_in("steps", 8, 1, 100));
    ss.done();
    w.search = search;
  }
  if (w.search && d.name == "trace") s.fail(w.search->concurrency ? "max_concurrency" : "request_rate", "a trace cannot be searched");
  const auto rates = w.search && !w.search->concurrency ? std::vector<nlohmann::ordered_json>{nullptr} : levels(s.get("request_rate"));
  const auto concs = w.search && w.search->concurrency ? std::vector<nlohmann::ordered_json>{nullptr} : levels(s.get("max_concurrency"));
  if (w.search && (rates.size() > 1 || concs.size() > 1)) {
    s.fail(w.search->concurrency ? "request_rate" : "max_concurrency", "cannot list levels beside a searched one");
  }
  if (rates.empty()) s.fail("request_rate", "an empty list");
  if (concs.empty()) s.fail("max_concurrency", "an empty list");
  if (d.name == "trace" && s.has("request_rate")) s.fail("request_rate", "a trace replays its own arrival times");
  s.done();
  const bool rate_levels = rates.size() > 1, conc_levels = concs.size() > 1;
  std::set<std::string> seen;
  for (const auto& c : concs) {
    if (!c.is_null() && (!c.is_number_integer() || c.get<int64_t>() < 1)) {
      s.fail("max_concurrency", "must be a positive integer (or a list of them), got " + c.dump());
    }
    for (const auto& r : rates) {
      WorkloadSpec level = w;
      level.request_rate = parse_rate(s, r);
      if (!c.is_null()) level.max_concurrency = c.get<int64_t>();
      level.name = w.group;
      if (conc_levels || rate_levels) level.name += "@";
      if (conc_levels) level.name += "c" + (c.is_null() ? std::string("none") : std::to_string(c.get<int64_t>()));
      if (rate_levels) level.name += "r" + (std::isinf(level.request_rate) ? std::string("inf") : number_text(level.request_rate));
      if (!seen.insert(level.name).second) s.fail(conc_levels ? "max_concurrency" : "request_rate", "lists a value twice");
      out.push_back(level);
    }
  }
  return w;
}

}  // namespace

std::vector<WorkloadSpec> parse_workloads(const SpecFile& f, const nlohmann::ordered_json& list) {
  std::vector<WorkloadSpec> out;
  std::set<std::string> groups;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = "workloads[" + std::to_string(i) + "]";
    const WorkloadSpec w = parse_one(f, list[i], path, out);
    if (!groups.insert(w.group).second) f.fail(path + ".name", "two workloads are named '" + w.group + "'");
  }
  std::set<std::string> names;
  for (const auto& w : out) {
    if (!names.insert(w.name).second) f.fail("workloads", "two workloads end up named '" + w.name + "'");
  }
  return out;
}

size_t max_runs(const std::vector<WorkloadSpec>& workloads, int repeat) {
  size_t runs = 0;
  for (const WorkloadSpec& w : workloads) runs += static_cast<size_t>(w.search ? w.search->steps : 1) * static_cast<size_t>(repeat);
  return runs;
}

nlohmann::ordered_json WorkloadSpec::to_json() const {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["group"] = group;
  j["dataset"] = data.name;
  j["num_prompts"] = data.num_prompts;
  j["seed"] = data.seed;
  if (data.name == "random") {
    // A multi-turn length distribution replaces its plain key (the reproducing command takes one of the two).
    if (data.multi_turn_input_len_dist.empty()) j["input_len"] = data.random_input_len;
    if (data.multi_turn_output_len_dist.empty()) j["output_len"] = data.random_output_len;
    j["range_ratio"] = data.random_range_ratio;
    j["range_mode"] = data.random_range_mode;
    j["prefix_len"] = data.random_prefix_len;
  } else if (data.name == "sharegpt") {
    if (!data.path.empty()) j["dataset_path"] = data.path;
    j["output_len"] = data.sharegpt_output_len ? nlohmann::ordered_json(*data.sharegpt_output_len) : nlohmann::ordered_json();
    j["min_len"] = data.sharegpt_min_len;
    j["max_prompt_len"] = data.sharegpt_max_prompt_len;
    j["max_total_len"] = data.sharegpt_max_total_len;
    j["disable_shuffle"] = data.disable_shuffle;
  } else if (data.name == "trace") {
    j["dataset_path"] = data.path;
    j["time_scale"] = data.trace_time_scale;
  } else if (data.name == "prefix") {
    j["num_groups"] = data.prefix_num_groups;
    j["system_prompt_len"] = data.prefix_system_prompt_len;
    j["question_len"] = data.prefix_question_len;
    j["output_len"] = data.prefix_output_len;
  }
  if (data.multi_turn) {
    nlohmann::ordered_json mt;
    mt["history"] = data.multi_turn_history;
    if (data.name == "sharegpt") {
      mt["max_turns"] = data.multi_turn_max_turns;
    } else {
      if (data.multi_turn_turns_dist.empty()) mt["turns"] = data.multi_turn_turns;
      if (data.multi_turn_prefix_len_dist.empty()) mt["prefix_len"] = data.multi_turn_prefix_len;
      mt["system_len"] = data.multi_turn_system_len;
      mt["tool_result_len"] = data.multi_turn_tool_result_len;
      for (const auto& [key, text] : {std::pair{"turns_dist", &data.multi_turn_turns_dist},
                                      {"input_len_dist", &data.multi_turn_input_len_dist},
                                      {"output_len_dist", &data.multi_turn_output_len_dist},
                                      {"prefix_len_dist", &data.multi_turn_prefix_len_dist}}) {
        if (!text->empty()) mt[key] = *text;
      }
    }
    mt["think_time"] = think_time_s;
    mt["think_time_dist"] = think_time_dist;
    if (!think_time_trace.empty()) mt["think_time_trace"] = think_time_trace;
    j["multi_turn"] = mt;
  }
  j["request_rate"] = std::isinf(request_rate) ? nlohmann::ordered_json("inf") : nlohmann::ordered_json(request_rate);
  j["burstiness"] = burstiness;
  j["max_concurrency"] = max_concurrency ? nlohmann::ordered_json(*max_concurrency) : nlohmann::ordered_json();
  j["num_warmups"] = num_warmups;
  j["ignore_eos"] = ignore_eos;
  return j;
}

}  // namespace servetune::tuner
