// vLLM's multi-turn records and summary (see vllm_multi_turn.h).
#include "loadgen/vllm_multi_turn.h"

#include <algorithm>
#include <cmath>

#include "loadgen/metrics.h"

namespace servetune::loadgen {
namespace {

std::vector<const VllmTurnStats*> by_start(const std::vector<VllmTurnStats>& records) {
  std::vector<const VllmTurnStats*> v;
  for (const VllmTurnStats& r : records) v.push_back(&r);
  std::stable_sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->start_time_ms < b->start_time_ms; });
  return v;
}

nlohmann::ordered_json describe(const std::vector<double>& x) {
  nlohmann::ordered_json d;
  const double n = static_cast<double>(x.size());
  double sum = 0.0;
  for (double v : x) sum += v;
  const double mean = sum / n;
  double ss = 0.0;
  for (double v : x) ss += (v - mean) * (v - mean);
  d["count"] = x.size();
  d["mean"] = mean;
  d["std"] = x.size() > 1 ? nlohmann::ordered_json(std::sqrt(ss / (n - 1.0))) : nlohmann::ordered_json();  // pandas: NaN
  d["min"] = *std::min_element(x.begin(), x.end());
  std::vector<std::pair<const char*, double>> ps = {{"25%", 25}, {"50%", 50}, {"75%", 75}, {"90%", 90}};
  if (x.size() >= 100) ps.push_back({"99%", 99});
  if (x.size() >= 1000) ps.push_back({"99.9%", 99.9});
  if (x.size() >= 10000) ps.push_back({"99.99%", 99.99});
  for (const auto& [label, p] : ps) d[label] = percentile_linear(x, p);
  d["max"] = *std::max_element(x.begin(), x.end());
  return d;
}

}  // namespace

std::vector<VllmTurnStats> vllm_turn_stats(const RunSpec& spec, const RunResult& run,
                                           const std::function<int64_t(const std::string&)>& count_tokens) {
  std::vector<VllmTurnStats> out;
  const bool server_history = static_cast<bool>(spec.render);
  size_t first = 0;                  // the current session's first request
  std::vector<int64_t> message_tokens;  // memo: a session's turns share their history's leading messages
  for (size_t i = 0; i < run.outputs.size() && i < spec.requests.size(); ++i) {
    const datasets::SampleRequest& s = *spec.requests[i].sample;
    if (i == 0 || s.turn == 0 || s.session != spec.requests[i - 1].sample->session) {
      first = i;
      message_tokens.clear();
    }
    const RequestOutput& o = run.outputs[i];
    if (!o.success) continue;
    int64_t input = 0, last = 0;
    size_t reply = 0;  // assistant messages so far: the j-th is turn j's reply
    for (size_t m = 0; m < s.messages.size(); ++m) {
      const bool assistant = s.messages[m].role == "assistant";
      if (m >= message_tokens.size()) {
        const bool from_server = server_history && assistant && first + reply < i;
        message_tokens.push_back(count_tokens(from_server ? run.outputs[first + reply].generated_text : s.messages[m].content));
      }
      reply += assistant ? 1 : 0;
      last = message_tokens[m];
      input += last;
    }
    VllmTurnStats r;
    r.input_num_turns = static_cast<int64_t>(s.messages.size());
    r.input_num_tokens = input;
    r.approx_cached_percent = input > 0 ? 100.0 * static_cast<double>(input - last) / static_cast<double>(input) : 0.0;
    r.output_num_tokens = o.output_tokens > 0 ? o.output_tokens : count_tokens(o.generated_text);
    r.output_num_chunks = static_cast<int64_t>(o.itl.size());
    r.output_num_first_chunk_tokens = o.chunk_tokens.empty() ? 1 : o.chunk_tokens.front();
    r.latency_ms = 1000.0 * o.latency;
    r.start_time_ms = 1000.0 * o.start_time;
    const int64_t out_n = r.output_num_tokens, first_n = r.output_num_first_chunk_tokens;
    if (out_n > 1 && out_n > first_n) r.tpot_ms = (r.latency_ms - 1000.0 * o.ttft) / static_cast<double>(out_n - first_n);
    r.ttft_ms = first_n > 1 ? std::max(0.1, 1000.0 * o.ttft - static_cast<double>(first_n - 1) * r.tpot_ms) : 1000.0 * o.ttft;
    r.conversation_id = std::to_string(s.session);
    r.turn = s.turn;
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::ordered_json vllm_multi_turn_summary(const std::vector<VllmTurnStats>& records) {
  nlohmann::ordered_json j;
  const auto sorted = by_start(records);
  const double runtime_s =
      sorted.empty() ? 0.0 : (sorted.back()->start_time_ms + sorted.back()->latency_ms - sorted.front()->start_time_ms) / 1000.0;
  j["runtime_sec"] = runtime_s;
  j["requests_per_sec"] = runtime_s > 0 ? static_cast<double>(records.size()) / runtime_s : 0.0;
  nlohmann::ordered_json table = nlohmann::ordered_json::object();
  if (!records.empty()) {
    const auto column = [&](auto field) {
      std::vector<double> v;
      for (const VllmTurnStats& r : records) v.push_back(static_cast<double>(field(r)));
      return describe(v);
    };
    table["ttft_ms"] = column([](const VllmTurnStats& r) { return r.ttft_ms; });
    table["tpot_ms"] = column([](const VllmTurnStats& r) { return r.tpot_ms; });
    table["latency_ms"] = column([](const VllmTurnStats& r) { return r.latency_ms; });
    table["input_num_turns"] = column([](const VllmTurnStats& r) { return r.input_num_turns; });
    table["input_num_tokens"] = column([](const VllmTurnStats& r) { return r.input_num_tokens; });
    table["output_num_tokens"] = column([](const VllmTurnStats& r) { return r.output_num_tokens; });
    table["output_num_chunks"] = column([](const VllmTurnStats& r) { return r.output_num_chunks; });
  }
  j["multi_turn_statistics"] = table;
  return j;
}

nlohmann::ordered_json vllm_multi_turn_requests(const std::vector<VllmTurnStats>& records) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const VllmTurnStats* r : by_start(records)) {
    nlohmann::ordered_json j;
    j["ttft_ms"] = r->ttft_ms;
    j["tpot_ms"] = r->tpot_ms;
    j["latency_ms"] = r->latency_ms;
    j["start_time_ms"] = r->start_time_ms;
    j["end_time_ms"] = r->start_time_ms + r->latency_ms;
    j["input_num_turns"] = r->input_num_turns;
    j["input_num_tokens"] = r->input_num_tokens;
    j["output_num_tokens"] = r->output_num_tokens;
    j["output_num_chunks"] = r->output_num_chunks;
    j["output_num_first_chunk_tokens"] = r->output_num_first_chunk_tokens;
    j["approx_cached_percent"] = r->approx_cached_percent;
    j["conversation_id"] = r->conversation_id;
    j["turn"] = r->turn;
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace servetune::loadgen
