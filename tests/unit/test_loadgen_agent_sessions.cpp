// Agent-shaped sessions (a system message first) with the server's replies as history: the dispatcher finds a
// session's replies by role, and vLLM's multi-turn records of such a run (word-count tokens) count the messages
// sent: history tokens and approx_cached_percent with the server's replies in place, TTFT/TPOT adjusted for a
// multi-token first chunk, failed turns left out; the summary's runtime_sec from the last-started request and
// describe()'s labels.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "loadgen/dispatcher.h"
#include "loadgen/vllm_multi_turn.h"

namespace servetune::loadgen {
namespace {

int64_t words(const std::string& text) {
  std::istringstream in(text);
  int64_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

// One session: a two-word system message, then turns t = 0..turns-1 asking "q t" with the dataset's reply "dataset
// reply" between them.
std::vector<datasets::SampleRequest> agent_session(int turns) {
  std::vector<datasets::SampleRequest> v;
  std::vector<ChatMessage> history = {{"system", "be brief"}};
  for (int t = 0; t < turns; ++t) {
    history.push_back({"user", "q " + std::to_string(t)});
    datasets::SampleRequest r;
    r.messages = history;
    r.session = 0;
    r.turn = t;
    v.push_back(r);
    history.push_back({"assistant", "dataset reply"});
  }
  return v;
}

RunSpec server_history_plan(const std::vector<datasets::SampleRequest>& reqs) {
  RunSpec spec;
  spec.sessions = true;
  for (const auto& r : reqs) spec.requests.push_back({&r, 0.0, 0.0});
  spec.render = [](datasets::SampleRequest& r) {
    r.prompt.clear();
    for (const auto& m : r.messages) r.prompt += m.content + "|";
  };
  return spec;
}

TEST(Dispatcher, ServerHistoryReplacesRepliesNotMessagesAfterASystemPrompt) {
  const auto reqs = agent_session(3);
  const RunSpec spec = server_history_plan(reqs);
  std::vector<RequestOutput> out(reqs.size());
  Dispatcher d(spec, out);
  ASSERT_EQ(d.next(0.0)->index, 0u);
  out[0].success = true;
  out[0].generated_text = "server said A";
  d.finished(0, 0.0);
  EXPECT_EQ(d.next(0.0)->sample->prompt, "be brief|q 0|server said A|q 1|");
  out[1].success = true;
  out[1].generated_text = "server said B";
  d.finished(1, 0.0);
  EXPECT_EQ(d.next(0.0)->sample->prompt, "be brief|q 0|server said A|q 1|server said B|q 2|");
}

TEST(VllmMultiTurn, RecordsUseTheMessagesSentAndAdjustForTheFirstChunk) {
  const auto reqs = agent_session(3);
  const RunSpec spec = server_history_plan(reqs);
  RunResult run;
  run.outputs.resize(3);
  for (int t = 0; t < 3; ++t) {
    RequestOutput& o = run.outputs[static_cast<size_t>(t)];
    o.success = t < 2;  // the third turn failed: vLLM records no stats for it
    o.session = 0;
    o.turn = t;
    o.start_time = 1.0 + t;
    o.ttft = 0.1;
    o.latency = 0.5;
    o.output_tokens = 5;
    o.itl = {0.1, 0.1, 0.1, 0.1};
    o.generated_text = "four words from server";
  }
  run.outputs[1].chunk_tokens = {2, 1, 1, 1};  // in-process: the first chunk carried two tokens
  run.outputs[1].itl = {0.1, 0.2, 0.1};
  const auto records = vllm_turn_stats(spec, run, words);
  ASSERT_EQ(records.size(), 2u);
  const VllmTurnStats& a = records[0];
  EXPECT_EQ(a.input_num_turns, 2);        // system + first question
  EXPECT_EQ(a.input_num_tokens, 2 + 2);   // "be brief", "q 0"
  EXPECT_DOUBLE_EQ(a.approx_cached_percent, 50.0);  // the system prompt is history too
  EXPECT_DOUBLE_EQ(a.tpot_ms, 400.0 / 4);  // (latency - ttft) / (5 - 1)
  EXPECT_DOUBLE_EQ(a.ttft_ms, 100.0);
  EXPECT_EQ(a.output_num_chunks, 4);
  EXPECT_DOUBLE_EQ(a.start_time_ms, 1000.0);
  EXPECT_EQ(a.conversation_id, "0");
  const VllmTurnStats& b = records[1];
  EXPECT_EQ(b.input_num_turns, 4);
  EXPECT_EQ(b.input_num_tokens, 2 + 2 + 4 + 2);  // the server's 4-word reply, not the dataset's 2 words
  EXPECT_DOUBLE_EQ(b.approx_cached_percent, 100.0 * 8 / 10);
  EXPECT_EQ(b.output_num_first_chunk_tokens, 2);
  EXPECT_EQ(b.output_num_chunks, 3);
  EXPECT_DOUBLE_EQ(b.tpot_ms, 400.0 / 3);                  // (500 - 100) / (5 - 2)
  EXPECT_DOUBLE_EQ(b.ttft_ms, std::max(0.1, 100.0 - 400.0 / 3));  // less one token's tpot, floored at 0.1 ms
  EXPECT_EQ(b.turn, 1);
}

VllmTurnStats record(double start_ms, double latency_ms, double ttft_ms) {
  return {.ttft_ms = ttft_ms, .latency_ms = latency_ms, .start_time_ms = start_ms, .input_num_turns = 1};
}

TEST(VllmMultiTurn, SummaryAsVllmComputesIt) {
  // Started at 0, 1000, 2000 and 500 ms; the last to start (2000) ends at 2100 ms, though the one started at 500
  // ends later: vLLM takes the last-started request's end.
  const std::vector<VllmTurnStats> records = {record(0, 100, 10), record(1000, 100, 20), record(2000, 100, 30),
                                              record(500, 5000, 40)};
  const nlohmann::ordered_json j = vllm_multi_turn_summary(records);
  EXPECT_DOUBLE_EQ(j["runtime_sec"].get<double>(), 2.1);
  EXPECT_DOUBLE_EQ(j["requests_per_sec"].get<double>(), 4 / 2.1);
  const nlohmann::ordered_json& ttft = j["multi_turn_statistics"]["ttft_ms"];
  EXPECT_EQ(ttft["count"].get<int>(), 4);
  EXPECT_DOUBLE_EQ(ttft["mean"].get<double>(), 25.0);
  EXPECT_NEAR(ttft["std"].get<double>(), std::sqrt(500.0 / 3.0), 1e-12);  // ddof 1, as pandas
  EXPECT_DOUBLE_EQ(ttft["min"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(ttft["25%"].get<double>(), 17.5);
  EXPECT_DOUBLE_EQ(ttft["50%"].get<double>(), 25.0);
  EXPECT_DOUBLE_EQ(ttft["90%"].get<double>(), 37.0);
  EXPECT_DOUBLE_EQ(ttft["max"].get<double>(), 40.0);
  EXPECT_FALSE(ttft.contains("99%"));
  const nlohmann::ordered_json rows = vllm_multi_turn_requests(records);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_DOUBLE_EQ(rows[1]["start_time_ms"].get<double>(), 500.0);  // by start time
  EXPECT_DOUBLE_EQ(rows[1]["end_time_ms"].get<double>(), 5500.0);

  const std::vector<VllmTurnStats> many(100, record(0, 10, 1));
  EXPECT_TRUE(vllm_multi_turn_summary(many)["multi_turn_statistics"]["latency_ms"].contains("99%"));
  const nlohmann::ordered_json none = vllm_multi_turn_summary({});
  EXPECT_EQ(none["runtime_sec"].get<double>(), 0.0);
  EXPECT_TRUE(none["multi_turn_statistics"].empty());
}

}  // namespace
}  // namespace servetune::loadgen
