// "Serving Benchmark Result" blocks as `vllm bench serve` and SGLang's bench_serving print them (any version, any
// number per file, text around them ignored); a block must close with "=====" and hold only "label: value" rows.
#include <map>
#include <regex>
#include <set>

#include "importers/import_util.h"
#include "servetune/error.h"

namespace servetune::importers::import_detail {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Drops a quoting prefix copied from documents or shell comments ("# ", "> ", "// ").
std::string clean(const std::string& raw) {
  std::string s = trim(raw);
  while (!s.empty() && (s[0] == '#' || s[0] == '>' || s.rfind("//", 0) == 0)) {
    const size_t n = s.rfind("//", 0) == 0 ? 2 : 1;
    if (s.size() > n && s[n] != ' ' && s[n] != '\t' && s[n] != '#' && s[n] != '>') break;
    s = trim(s.substr(n));
  }
  return s;
}

bool all_of_char(const std::string& s, char c) { return !s.empty() && s.find_first_not_of(c) == std::string::npos; }

bool is_header(const std::string& s) {
  return s.size() > 2 && s[0] == '=' && lower(s).find("serving benchmark result") != std::string::npos;
}

// "------Time to First Token------" -> "Time to First Token"; "" when not a section line.
std::string section_title(const std::string& s) {
  if (s.size() < 3 || s[0] != '-' || s.back() != '-') return "";
  const size_t b = s.find_first_not_of('-'), e = s.find_last_not_of('-');
  if (b == std::string::npos) return "";
  return trim(s.substr(b, e - b + 1));
}

enum class Row { kMetric, kWorkload, kSource };
struct Known {
  Row kind;
  const char* key;
};

const std::map<std::string, Known>& known_rows() {
  static const std::map<std::string, Known> rows = {
      {"successful requests", {Row::kMetric, "completed"}},
      {"failed requests", {Row::kMetric, "failed"}},
      {"benchmark duration (s)", {Row::kMetric, "duration"}},
      {"total input tokens", {Row::kMetric, "total_input_tokens"}},
      {"total generated tokens", {Row::kMetric, "total_output_tokens"}},
      {"request throughput (req/s)", {Row::kMetric, "request_throughput"}},
      {"request goodput (req/s)", {Row::kMetric, "request_goodput"}},
      {"output token throughput (tok/s)", {Row::kMetric, "output_throughput"}},
      {"peak output token throughput (tok/s)", {Row::kMetric, "max_output_tokens_per_s"}},
      {"peak concurrent requests", {Row::kMetric, "max_concurrent_requests"}},
      {"total token throughput (tok/s)", {Row::kMetric, "total_token_throughput"}},
      {"total throughput (tok/s)", {Row::kMetric, "total_token_throughput"}},  // SGLang before 0.4
      {"maximum request concurrency", {Row::kWorkload, "max_concurrency"}},
      {"max request concurrency", {Row::kWorkload, "max_concurrency"}},          // SGLang
      {"request rate configured (rps)", {Row::kWorkload, "request_rate"}},
      {"traffic request rate", {Row::kWorkload, "request_rate"}},                // SGLang, and vLLM's preamble
      {"burstiness factor", {Row::kWorkload, "burstiness"}},
      {"backend", {Row::kSource, "backend"}},                                    // SGLang
      {"acceptance rate (%)", {Row::kMetric, "spec_decode_acceptance_rate"}},    // Speculative Decoding section
      {"acceptance length", {Row::kMetric, "spec_decode_acceptance_length"}},
      {"accept length", {Row::kMetric, "spec_decode_acceptance_length"}},        // SGLang
      {"drafts", {Row::kMetric, "spec_decode_num_drafts"}},
      {"draft tokens", {Row::kMetric, "spec_decode_draft_tokens"}},
      {"accepted tokens", {Row::kMetric, "spec_decode_accepted_tokens"}},
  };
  return rows;
}

struct Block {
  ImportedResult result;
  std::set<std::string> labels;
  std::string section;
  bool sglang = false;
};

[[noreturn]] void fail(const std::string& path, int line, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ":" + std::to_string(line) + ": " + what);
}

// A workload value: a number, "inf", or "not set" / "None" (null).
nlohmann::ordered_json workload_value(const std::string& key, const std::string& value, const std::string& path, int line,
                                      const std::string& label) {
  const std::string v = lower(value);
  if (v == "inf" || v == "infinity") return "inf";
  if (v == "not set" || v == "none" || v == "n/a" || v == "-") return nullptr;
  std::string head = value;
  if (key == "burstiness") head = value.substr(0, value.find(' '));  // "1.0 (Poisson process)"
  const auto n = parse_number(head);
  if (!n) fail(path, line, "'" + label + "' has the value '" + value + "', not a number");
  return number_json(*n);
}

void add_row(Block& b, const std::string& label, const std::string& value, const std::string& path, int line) {
  const std::string key_label = lower(label);
  if (!b.labels.insert(key_label).second) {
    fail(path, line, "'" + label + ":' appears twice in the result block that starts at line " + std::to_string(b.result.line));
  }
  ImportedResult& r = b.result;
  const auto& rows = known_rows();
  if (const auto it = rows.find(key_label); it != rows.end()) {
    const Known& k = it->second;
    if (k.kind == Row::kSource) {
      r.source[k.key] = value;
      b.sglang = true;
    } else if (k.kind == Row::kWorkload) {
      r.workload[k.key] = workload_value(k.key, value, path, line, label);
      if (key_label == "traffic request rate" || key_label == "max request concurrency") b.sglang = true;
    } else {
      const auto n = parse_number(value);
      if (!n) fail(path, line, "'" + label + "' has the value '" + value + "', not a number");
      r.metrics[k.key] = number_json(*n);
    }
    return;
  }
  // "Mean TTFT (ms)", "P99.9 E2E Latency (ms)", "Max ITL (ms)".
  static const std::regex stat_re(R"(^(\S+)\s+(.+?)\s*\((ms|s)\)$)", std::regex::icase);
  std::smatch m;
  if (std::regex_match(label, m, stat_re)) {
    const std::string stat = stat_name(m[1].str()), name = latency_name(m[2].str());
    if (!stat.empty() && !name.empty()) {
      const auto n = parse_number(value);
      if (!n) fail(path, line, "'" + label + "' has the value '" + value + "', not a number");
      if (lower(m[2].str()).find("e2e latency") != std::string::npos) b.sglang = true;
      r.metrics[stat + "_" + name + "_ms"] = *n * (lower(m[3].str()) == "s" ? 1000.0 : 1.0);
      return;
    }
  }
  if (key_label.find("retokenized") != std::string::npos) b.sglang = true;
  const std::string key = (b.section.empty() ? "" : slug(b.section) + ".") + slug(label);
  const auto n = parse_number(value);
  r.extra[key] = n ? number_json(*n) : nlohmann::ordered_json(value);
}

}  // namespace

std::vector<ImportedResult> parse_text_blocks(const std::string& path, const std::string& text) {
  std::vector<ImportedResult> out;
  std::optional<Block> block;
  nlohmann::ordered_json preamble = nlohmann::ordered_json::object();  // vLLM prints rate/concurrency before the block
  static const std::regex row_re(R"(^(.*?[^\s:]):\s+(\S.*)$)");
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string raw = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    const std::string s = clean(raw);
    if (!block) {
      if (is_header(s)) {
        block.emplace();
        block->result.line = line_no;
        block->result.locator = "line " + std::to_string(line_no);
        block->result.workload = preamble;
        preamble = nlohmann::ordered_json::object();
        continue;
      }
      std::smatch m;
      if (std::regex_match(s, m, row_re)) {
        const std::string l = lower(m[1].str());
        const auto it = known_rows().find(l);
        if (it != known_rows().end() && it->second.kind == Row::kWorkload) {
          try {
            preamble[it->second.key] = workload_value(it->second.key, trim(m[2].str()), path, line_no, m[1].str());
          } catch (const Error&) {
            // Outside a block, a line that merely looks like a row is prose, not an error.
          }
        }
      }
      continue;
    }
    if (s.empty() || s.rfind("```", 0) == 0) continue;
    if (is_header(s)) {
      fail(path, line_no, "a new result block starts before the one at line " + std::to_string(block->result.line) +
                              " ended (its closing '=====' line is missing: truncated?)");
    }
    if (all_of_char(s, '=')) {
      Block& b = *block;
      if (b.labels.empty()) fail(path, line_no, "the result block that starts at line " + std::to_string(b.result.line) + " is empty");
      b.result.format = b.sglang ? "sglang-text" : "vllm-text";
      if (b.sglang && b.result.source.contains("backend")) b.result.source["tool"] = "sglang.bench_serving";
      finish_result(b.result, path);  // "PATH: line N: no 'output_throughput' ..."
      out.push_back(std::move(b.result));
      block.reset();
      continue;
    }
    if (all_of_char(s, '-')) continue;
    if (const std::string title = section_title(s); !title.empty()) {
      block->section = title;  // a "Label:" line inside it adds " / Label"
      continue;
    }
    if (s.back() == ':' && s.find(": ") == std::string::npos) {  // "Per-position acceptance (%):" opens a sub-list
      block->section = block->section.substr(0, block->section.find(" / ")) + " / " + s.substr(0, s.size() - 1);
      continue;
    }
    std::smatch m;
    if (!std::regex_match(s, m, row_re)) {
      fail(path, line_no, "not a 'label: value' row of the result block that starts at line " +
                              std::to_string(block->result.line) + ": '" + s.substr(0, 80) + "'");
    }
    add_row(*block, trim(m[1].str()), trim(m[2].str()), path, line_no);
  }
  if (block) {
    fail(path, line_no, "the result block that starts at line " + std::to_string(block->result.line) +
                            " ends without its closing '=====' line (truncated?)");
  }
  return out;
}

}  // namespace servetune::importers::import_detail
