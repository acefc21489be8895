// Reproducing command lines (see command_line.h).
#include "tuner/command_line.h"

#include "servetune/engine_config.h"
#include "tuner/server_command.h"

namespace servetune::tuner {
namespace {

std::string text(const nlohmann::ordered_json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

void add(std::string& out, const std::string& flag, const nlohmann::ordered_json& v) {
  out += (out.empty() ? "" : " ") + flag + " " + shell_quote(text(v));
}

}  // namespace

std::string engine_flags(const nlohmann::ordered_json& settings) {
  const nlohmann::ordered_json defaults = EngineConfig{};
  std::string out;
  for (const EngineSetting& setting : engine_settings()) {
    const std::string key(setting.key);
    if (key == "model" || !settings.contains(key)) continue;
    const auto& v = settings.at(key);
    if (v.is_null() || defaults.at(key) == v) continue;
    const std::string flag(setting.flag());
    if (v.is_boolean()) {
      if (v.get<bool>()) out += (out.empty() ? "" : " ") + flag;
      continue;
    }
    add(out, flag, v);
  }
  return out;
}

std::string bench_flags(const nlohmann::ordered_json& w) {
  std::string out;
  const std::string dataset = w.value("dataset", std::string("random"));
  add(out, "--dataset-name", dataset);
  if (w.contains("num_prompts")) add(out, "--num-prompts", w["num_prompts"]);
  if (w.contains("seed")) add(out, "--seed", w["seed"]);
  auto opt = [&](const char* key, const char* flag, const nlohmann::ordered_json& skip) {
    if (w.contains(key) && !w[key].is_null() && w[key] != skip) add(out, flag, w[key]);
  };
  if (dataset == "random") {
    opt("input_len", "--random-input-len", nullptr);
    opt("output_len", "--random-output-len", nullptr);
    opt("range_ratio", "--random-range-ratio", 0.0);
    opt("range_mode", "--random-range-mode", "vllm");
    opt("prefix_len", "--random-prefix-len", 0);
  } else if (dataset == "sharegpt") {
    opt("dataset_path", "--dataset-path", nullptr);
    opt("output_len", "--sharegpt-output-len", nullptr);
    opt("min_len", "--sharegpt-min-len", 4);
    opt("max_prompt_len", "--sharegpt-max-prompt-len", 1024);
    opt("max_total_len", "--sharegpt-max-total-len", 2048);
    if (w.value("disable_shuffle", false)) out += " --disable-shuffle";
  } else if (dataset == "trace") {
    opt("dataset_path", "--dataset-path", nullptr);
    opt("time_scale", "--trace-time-scale", 1.0);
  } else if (dataset == "prefix") {
    opt("num_groups", "--prefix-num-groups", nullptr);
    opt("system_prompt_len", "--prefix-system-prompt-len", nullptr);
    opt("question_len", "--prefix-question-len", nullptr);
    opt("output_len", "--prefix-output-len", nullptr);
  }
  if (w.contains("multi_turn") && w["multi_turn"].is_object()) {
    const nlohmann::ordered_json& mt = w["multi_turn"];
    out += " --multi-turn";
    auto mopt = [&](const char* key, const char* flag, const nlohmann::ordered_json& skip) {
      if (mt.contains(key) && !mt[key].is_null() && mt[key] != skip) add(out, flag, mt[key]);
    };
    mopt("history", "--multi-turn-history", "dataset");
    mopt("max_turns", "--multi-turn-max-turns", 0);
    mopt("turns", "--multi-turn-turns", 4);
    mopt("prefix_len", "--multi-turn-prefix-len", 0);
    mopt("system_len", "--multi-turn-system-len", 0);
    mopt("tool_result_len", "--multi-turn-tool-result-len", 0);
    mopt("think_time", "--think-time", 0.0);
    mopt("turns_dist", "--multi-turn-turns-dist", nullptr);
    mopt("input_len_dist", "--multi-turn-input-len-dist", nullptr);
    mopt("output_len_dist", "--multi-turn-output-len-dist", nullptr);
    mopt("prefix_len_dist", "--multi-turn-prefix-len-dist", nullptr);
    mopt("think_time_dist", "--think-time-dist", "fixed");
    mopt("think_time_trace", "--think-time-trace", nullptr);
  }
  opt("max_concurrency", "--max-concurrency", nullptr);
  opt("request_rate", "--request-rate", "inf");
  opt("burstiness", "--burstiness", 1.0);
  opt("num_warmups", "--num-warmups", 0);
  if (dataset == "sharegpt" && w.value("ignore_eos", false)) out += " --ignore-eos";
  return out;
}

}  // namespace servetune::tuner
