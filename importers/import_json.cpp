// JSON inputs: one document (vLLM / SGLang result, GuideLLM or AIPerf export, or an array) or JSON Lines (SGLang's
// --output-file); per-request arrays are summarised in source_extra, other unknown keys kept there as they are.
#include <algorithm>
#include <cmath>
#include <map>
#include <regex>

#include "importers/import_util.h"
#include "servetune/error.h"

namespace servetune::importers::import_detail {

namespace {

int line_of_offset(const std::string& text, size_t offset) {
  int line = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n' ? 1 : 0;
  return line;
}

[[noreturn]] void json_error(const std::string& path, int line, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ":" + std::to_string(line) + ": " + what);
}

std::vector<ImportedResult> parse_value(const nlohmann::ordered_json& j, const std::string& path, int line, const std::string& locator) {
  if (j.is_array()) {
    std::vector<ImportedResult> out;
    for (size_t i = 0; i < j.size(); ++i) {
      auto part = parse_value(j[i], path, line, locator + "[" + std::to_string(i) + "]");
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }
  if (!j.is_object()) json_error(path, line, locator + ": a JSON " + std::string(j.type_name()) + ", not a benchmark result object");
  if (looks_like_guidellm(j)) return parse_guidellm(j, path, line);
  if (looks_like_aiperf(j)) return parse_aiperf(j, path, line);
  if (j.contains("schema") && j["schema"].is_string() && j["schema"].get<std::string>().rfind("servetune.", 0) == 0) {
    json_error(path, line, "already a servetune record; copy it into the run folder's records/ instead of importing it");
  }
  return parse_flat_result(j, path, line, locator);
}

const std::regex& stat_key_re() {
  static const std::regex re(R"(^(mean|median|std|max|min|p[0-9]+(?:\.[0-9]+)?)_(.+)_ms$)");
  return re;
}

}  // namespace

std::vector<ImportedResult> parse_json_document(const std::string& path, const std::string& text) {
  try {
    const auto j = nlohmann::ordered_json::parse(text);
    const int line = line_of_offset(text, text.find_first_not_of(" \t\r\n"));
    try {
      return parse_value(j, path, line, "document");
    } catch (const nlohmann::json::exception& e) {  // a field of an unexpected type deep inside an export
      json_error(path, line, std::string("unexpected JSON structure: ") + e.what());
    }
  } catch (const nlohmann::json::parse_error& whole) {
    // JSON Lines: every non-blank line is one object (and the first one is complete).
    std::vector<std::pair<int, std::string>> lines;
    size_t pos = 0;
    int line = 0;
    while (pos < text.size()) {
      const size_t nl = text.find('\n', pos);
      std::string raw = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      pos = nl == std::string::npos ? text.size() : nl + 1;
      ++line;
      if (raw.find_first_not_of(" \t\r") != std::string::npos) lines.emplace_back(line, std::move(raw));
    }
    const bool jsonl = !lines.empty() && nlohmann::json::accept(lines.front().second) &&
                       std::all_of(lines.begin(), lines.end(), [](const auto& l) { return l.second[l.second.find_first_not_of(" \t")] == '{'; });
    if (!jsonl) {
      const size_t at = whole.byte == 0 ? 0 : whole.byte - 1;
      json_error(path, line_of_offset(text, at), std::string("not valid JSON (truncated?): ") + whole.what());
    }
    std::vector<ImportedResult> out;
    for (const auto& [n, raw] : lines) {
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(raw);
      } catch (const nlohmann::json::parse_error& e) {
        std::string what = e.what();  // its "line 1" is the line of the JSON Lines record; ours names the file's line
        if (const size_t at = what.find("at line 1, column"); at != std::string::npos) what.replace(at, 17, "at column");
        json_error(path, n, "not a complete JSON object on this line of a JSON Lines file (truncated?): " + what);
      }
      std::vector<ImportedResult> part;
      try {
        part = parse_value(j, path, n, "line " + std::to_string(n));
      } catch (const nlohmann::json::exception& e) {
        json_error(path, n, std::string("unexpected JSON structure: ") + e.what());
      }
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }
}

std::vector<ImportedResult> parse_flat_result(const nlohmann::ordered_json& j, const std::string& path, int line,
                                              const std::string& locator) {
  static const std::map<std::string, std::string> kMetricKeys = {
      {"duration", "duration"},
      {"completed", "completed"},
      {"failed", "failed"},
      {"total_input_tokens", "total_input_tokens"},
      {"total_output_tokens", "total_output_tokens"},
      {"request_throughput", "request_throughput"},
      {"request_goodput", "request_goodput"},
      {"request_goodput:", "request_goodput"},  // vLLM before 0.7 wrote the key with a colon
      {"output_throughput", "output_throughput"},
      {"total_token_throughput", "total_token_throughput"},
      {"total_throughput", "total_token_throughput"},  // SGLang
      {"max_output_tokens_per_s", "max_output_tokens_per_s"},
      {"max_concurrent_requests", "max_concurrent_requests"},
  };
  static const std::map<std::string, std::string> kWorkloadKeys = {
      {"dataset_name", "dataset"},          {"num_prompts", "num_prompts"},
      {"max_concurrency", "max_concurrency"}, {"request_rate", "request_rate"},
      {"burstiness", "burstiness"},         {"random_input_len", "input_len"},
      {"random_output_len", "output_len"},  {"random_range_ratio", "range_ratio"},
      {"random_prefix_len", "prefix_len"},  {"sharegpt_output_len", "output_len"},
      {"fixed_output_len", "output_len"},
  };
  static const std::map<std::string, std::string> kSourceKeys = {
      {"backend", "backend"}, {"endpoint_type", "backend"}, {"label", "label"}, {"model_id", "model"},
      {"tokenizer_id", "tokenizer"}, {"date", "date"}, {"tag", "tag"},
  };
  ImportedResult r;
  r.line = line;
  r.locator = locator == "document" ? "line " + std::to_string(line) : locator;
  bool sglang = false;
  const std::string where = path + ":" + std::to_string(line) + ": ";
  for (const auto& [k, v] : j.items()) {
    if (v.is_null()) continue;
    if (k == "total_throughput" || k == "total_output_tokens_retokenized" || k.find("e2e_latency") != std::string::npos ||
        k == "input_throughput" || k == "accept_length") {
      sglang = true;
    }
    if (const auto it = kMetricKeys.find(k); it != kMetricKeys.end()) {
      if (!v.is_number()) throw Error(ErrorKind::kFormat, where + "'" + k + "' is " + v.dump() + ", not a number");
      r.metrics[it->second] = v;
      continue;
    }
    if (k.rfind("spec_decode_", 0) == 0 && v.is_number()) {  // servetune's and vLLM's speculative-decoding counters
      r.metrics[k] = v;
      continue;
    }
    if (k == "accept_length" && v.is_number()) {  // SGLang
      r.metrics["spec_decode_acceptance_length"] = v;
      continue;
    }
    std::smatch m;
    if (std::regex_match(k, m, stat_key_re())) {
      const std::string name = latency_name(m[2].str());
      if (!name.empty()) {
        if (!v.is_number()) throw Error(ErrorKind::kFormat, where + "'" + k + "' is " + v.dump() + ", not a number");
        r.metrics[m[1].str() + "_" + name + "_ms"] = v;
        continue;
      }
    }
    if (const auto it = kWorkloadKeys.find(k); it != kWorkloadKeys.end()) {
      if (v.is_number() || v.is_string()) {
        const bool inf = v.is_number() && !std::isfinite(v.get<double>());
        r.workload[it->second] = inf ? nlohmann::ordered_json("inf") : v;
      }
      continue;
    }
    if (const auto it = kSourceKeys.find(k); it != kSourceKeys.end()) {
      if (!r.source.contains(it->second)) r.source[it->second] = v;
      continue;
    }
    if (v.is_array() && v.size() > 16) {
      r.extra[k] = "(" + std::to_string(v.size()) + " per-request values, not imported)";
    } else {
      r.extra[k] = v;
    }
  }
  if (r.metrics.empty()) {
    throw Error(ErrorKind::kFormat, where + "not a benchmark result: no vLLM / SGLang result keys (output_throughput, "
                                            "mean_ttft_ms, ...), GuideLLM 'benchmarks' or AIPerf metrics");
  }
  r.format = sglang ? "sglang-json" : "vllm-json";
  r.source["tool"] = sglang ? "sglang.bench_serving" : "vllm bench serve";
  finish_result(r, path);
  return {r};
}

}  // namespace servetune::importers::import_detail
