// Trace replay (Mooncake JSONL: {"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}):
// each hash id stands for one block of trace_block_size tokens shared by every request naming it, so prefix reuse
// in the trace becomes prefix reuse on the server; arrival times are the trace's, times trace_time_scale.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "datasets/dataset.h"
#include "datasets/token_prompt.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::datasets {
namespace {

struct TraceRecord {
  double timestamp_ms = 0.0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;
  int64_t line = 0;
};

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<TraceRecord> read_trace(const std::string& path, int64_t limit) {
  if (!std::filesystem::exists(path)) throw_usage("--dataset-path " + path + ": no such file");
  std::ifstream in(path);
  if (!in) throw_io(path, "cannot open the trace file");
  std::vector<TraceRecord> records;
  std::string line;
  int64_t line_no = 0;
  while (static_cast<int64_t>(records.size()) < limit && std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) throw_format(where, "not a JSON object");
    TraceRecord r;
    r.line = line_no;
    const auto need_number = [&](const char* key) -> const nlohmann::json& {
      auto it = j.find(key);
      if (it == j.end() || !it->is_number()) throw_format(where, std::string("missing numeric \"") + key + "\"");
      return *it;
    };
    r.timestamp_ms = need_number("timestamp").get<double>();
    const auto& in_len = need_number("input_length");
    const auto& out_len = need_number("output_length");
    if (!in_len.is_number_integer() || in_len.get<int64_t>() < 1) throw_format(where, "\"input_length\" must be an integer >= 1");
    if (!out_len.is_number_integer() || out_len.get<int64_t>() < 1) throw_format(where, "\"output_length\" must be an integer >= 1");
    r.input_length = in_len.get<int64_t>();
    r.output_length = out_len.get<int64_t>();
    if (auto it = j.find("hash_ids"); it != j.end()) {
      if (!it->is_array()) throw_format(where, "\"hash_ids\" must be an array of integers");
      for (const auto& h : *it) {
        if (!h.is_number_integer()) throw_format(where, "\"hash_ids\" must be an array of integers");
        r.hash_ids.push_back(h.get<int64_t>());
      }
    }
    records.push_back(std::move(r));
  }
  if (records.empty()) throw_format(path, "the trace has no records");
  return records;
}

}  // namespace

Workload sample_trace(const DatasetOptions& o, const Tokenizer& tokenizer) {
  if (o.path.empty()) throw_usage("--dataset-name trace needs --dataset-path (a Mooncake-format JSONL trace)");
  if (!(o.trace_time_scale > 0.0)) throw_usage("--trace-time-scale must be > 0");
  if (o.trace_block_size < 1) throw_usage("--trace-block-size must be >= 1");
  std::vector<TraceRecord> records = read_trace(o.path, o.num_prompts);
  std::stable_sort(records.begin(), records.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.timestamp_ms < b.timestamp_ms; });
  const double t0 = records.front().timestamp_ms;
  const std::vector<int32_t> allowed = allowed_token_ids(tokenizer);
  const int64_t n_special = num_special_tokens(tokenizer);
  std::unordered_map<int64_t, std::vector<int32_t>> blocks;
  const auto block = [&](int64_t hash_id) -> const std::vector<int32_t>& {
    auto [it, inserted] = blocks.try_emplace(hash_id);
    if (inserted) {
      Rng rng(mix64(o.seed ^ mix64(static_cast<uint64_t>(hash_id))));
      for (int64_t k = 0; k < o.trace_block_size; ++k) it->second.push_back(allowed[rng.below(allowed.size())]);
    }
    return it->second;
  };

  Workload w;
  w.dataset_name = "trace";
  w.timed = true;
  std::vector<int64_t> achieved, requested;
  int64_t off_target = 0;
  for (const TraceRecord& r : records) {
    const size_t target = static_cast<size_t>(std::max<int64_t>(1, r.input_length - n_special));
    std::vector<int32_t> ids;
    for (int64_t h : r.hash_ids) {
      if (ids.size() >= target) break;
      const auto& b = block(h);
      ids.insert(ids.end(), b.begin(), b.end());
    }
    Rng rng(mix64(o.seed + 0x5851F42D4C957F2Dull * static_cast<uint64_t>(r.line)));
    while (ids.size() < target) ids.push_back(allowed[rng.below(allowed.size())]);
    ids.resize(target);
    StablePrompt p = make_stable_prompt(tokenizer, std::move(ids), target, allowed, rng);
    if (p.ids.size() != target) ++off_target;
    SampleRequest s;
    s.prompt_len = static_cast<int64_t>(p.ids.size()) + n_special;
    s.prompt = std::move(p.text);
    s.output_len = r.output_length;
    s.arrival_s = (r.timestamp_ms - t0) * o.trace_time_scale / 1000.0;
    s.id = std::to_string(w.requests.size());
    achieved.push_back(s.prompt_len);
    requested.push_back(r.input_length);
    w.requests.push_back(std::move(s));
  }
  w.info = {{"path", o.path},
            {"records", static_cast<int64_t>(records.size())},
            {"time_scale", o.trace_time_scale},
            {"block_size", o.trace_block_size},
            {"distinct_hash_ids", static_cast<int64_t>(blocks.size())},
            {"span_s", w.requests.back().arrival_s.value_or(0.0)},
            {"requested_input_len", to_json(length_stats(requested))},
            {"achieved_input_len", to_json(length_stats(achieved))},
            {"prompts_off_target", off_target}};
  return w;
}

}  // namespace servetune::datasets
