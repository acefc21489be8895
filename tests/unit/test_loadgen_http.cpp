// The libcurl client against servetune_mock_openai: successful streams (completions and chat, unusual but valid
// SSE), and every injected failure counted as a failed request with its reason while the run completes; the
// client's read lag from the mock's send stamps, and its absence when the mock sends none.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include <curl/curl.h>

#include "core/error.h"
#include "loadgen/http_client.h"
#include "loadgen/session_metrics.h"
#include "loadgen/sse_parser.h"
#include "loadgen/stream_chunk.h"
#include "mock_server.h"

namespace servetune::loadgen {
namespace {

using servetune::testing::MockServer;

datasets::SampleRequest sample(const std::string& prompt, int64_t out) {
  datasets::SampleRequest r;
  r.prompt = prompt;
  r.prompt_len = 3;
  r.output_len = out;
  return r;
}

RunResult run_plan(const HttpClientOptions& o, const std::vector<datasets::SampleRequest>& reqs, int64_t cap = 0) {
  HttpClient client(o);
  RunSpec spec;
  spec.max_concurrency = cap;
  for (size_t i = 0; i < reqs.size(); ++i) spec.requests.push_back({&reqs[i], 0.001 * static_cast<double>(i)});
  return client.run(spec);
}

TEST(HttpClient, CompletionsStreamsAreMeasured) {
  MockServer server({"--itl-us", "2000"});
  HttpClientOptions o;
  o.api_url = server.url("/v1/completions");
  o.model = "mock";
  std::vector<datasets::SampleRequest> reqs;
  for (int i = 0; i < 20; ++i) reqs.push_back(sample("one two three", 5 + i % 3));
  reqs.push_back(sample("mock:quirky a b c", 6));
  const RunResult r = run_plan(o, reqs, 4);
  ASSERT_EQ(r.outputs.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestOutput& out = r.outputs[i];
    ASSERT_TRUE(out.success) << out.error;
    EXPECT_EQ(out.output_tokens, reqs[i].output_len);
    EXPECT_EQ(out.itl.size(), static_cast<size_t>(reqs[i].output_len - 1));
    EXPECT_GT(out.ttft, 0.0);
    EXPECT_GE(out.latency, out.ttft);
    EXPECT_GE(out.start_time, out.ready_time);
    EXPECT_GE(out.ready_time, out.scheduled_time);
    // Every event carried a send stamp: the content chunks, the usage chunk and [DONE].
    ASSERT_EQ(out.read_lags.size(), static_cast<size_t>(reqs[i].output_len + 2));
    for (double lag : out.read_lags) EXPECT_GE(lag, 0.0);
  }
  EXPECT_EQ(r.outputs[0].generated_text, " tok tok tok tok tok");
  EXPECT_EQ(r.outputs[0].prompt_len, 3);  // the mock's usage.prompt_tokens: the word count
  EXPECT_EQ(r.outputs.back().prompt_len, 4);
  const BenchmarkMetrics m = compute_metrics(r.outputs, r.duration_s, {99}, {});
  EXPECT_LE(m.max_concurrent_requests, 4);  // --max-concurrency holds
  EXPECT_GE(m.max_concurrent_requests, 2);
  ASSERT_TRUE(m.client_lag_ms.has_value());
  EXPECT_GE(m.client_lag_ms->median, 0.0);
}

TEST(HttpClient, NoSendStampsNoReadLag) {
  MockServer server({"--no-timestamps"});
  HttpClientOptions o;
  o.api_url = server.url("/v1/completions");
  const std::vector<datasets::SampleRequest> reqs = {sample("one two", 4), sample("mock:quirky x", 3)};
  const RunResult r = run_plan(o, reqs);
  for (const RequestOutput& out : r.outputs) {
    ASSERT_TRUE(out.success) << out.error;
    EXPECT_TRUE(out.read_lags.empty());
  }
  const BenchmarkMetrics m = compute_metrics(r.outputs, r.duration_s, {99}, {});
  EXPECT_FALSE(m.client_lag_ms.has_value());
  EXPECT_EQ(m.client_lag_events, 0);
}

size_t append_body(char* ptr, size_t size, size_t nmemb, void* userdata) {
  static_cast<std::string*>(userdata)->append(ptr, size * nmemb);
  return size * nmemb;
}

// The stamp line sits outside the data payload, so the payloads of a stream keep the same bytes around their text
// and the chunk parser's text-only scan takes every content chunk but the first and the last (finish_reason).
TEST(HttpClient, SendStampsKeepTheChunkParsersFastPath) {
  MockServer server;
  std::string body;
  CURL* e = curl_easy_init();
  ASSERT_NE(e, nullptr);
  const std::string url = server.url("/v1/completions");
  const std::string req = R"({"model":"mock","prompt":"a b","max_tokens":50,"stream":true,)"
                          R"("stream_options":{"include_usage":true}})";
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, req.c_str());
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
  const CURLcode rc = curl_easy_perform(e);
  curl_slist_free_all(headers);
  curl_easy_cleanup(e);
  ASSERT_EQ(rc, CURLE_OK);
  SseParser sse;
  StreamChunkParser chunks;
  StreamChunk chunk;
  int64_t events = 0, stamped = 0, content = 0;
  std::string text;
  sse.feed(body, [&](const SseEvent& ev) {
    ++events;
    stamped += ev.sent_ns >= 0;
    chunks.parse(ev.data, ApiKind::kCompletions, chunk);
    EXPECT_TRUE(chunk.error.empty()) << chunk.error;
    content += chunk.has_choices;
    text += chunk.text;
  });
  EXPECT_EQ(sse.malformed(), 0);
  EXPECT_EQ(events, 52);  // 50 content chunks, usage, [DONE]
  EXPECT_EQ(stamped, 52);
  EXPECT_EQ(content, 50);
  EXPECT_EQ(text.size(), 50u * 4);
  EXPECT_EQ(chunks.fast_path_hits(), 48);
}

TEST(HttpClient, ChatBackend) {
  MockServer server;
  HttpClientOptions o;
  o.backend = "openai-chat";
  o.api_url = server.url("/v1/chat/completions");
  std::vector<datasets::SampleRequest> reqs = {sample("hello there", 7), sample("hi", 1)};
  const RunResult r = run_plan(o, reqs);
  for (const RequestOutput& out : r.outputs) ASSERT_TRUE(out.success) << out.error;
  EXPECT_EQ(r.outputs[0].output_tokens, 7);
  EXPECT_EQ(r.outputs[1].output_tokens, 1);
  EXPECT_TRUE(r.outputs[1].itl.empty());
  o.api_url = server.url("/v1/completions");
  EXPECT_THROW(HttpClient{o}, Error);  // the chat backend needs a chat endpoint
}

TEST(HttpClient, InjectedFailuresAreCountedWithReasons) {
  MockServer server({"--itl-us", "1000"});
  HttpClientOptions o;
  o.api_url = server.url("/v1/completions");
  o.request_timeout_s = 1.0;
  struct Case {
    std::string prompt;
    std::string error;
    RequestFailure failure;
  };
  const std::vector<Case> cases = {
      {"mock:reset:3", "transport error", RequestFailure::kTransport},
      {"mock:status:429", "HTTP 429", RequestFailure::kHttpStatus},
      {"mock:status:503", "HTTP 503", RequestFailure::kHttpStatus},
      {"mock:malformed_sse:2", "malformed SSE", RequestFailure::kBadResponse},
      {"mock:malformed_json:2", "malformed JSON in SSE data", RequestFailure::kBadResponse},
      {"mock:no_done", "stream ended without [DONE]", RequestFailure::kBadResponse},
      {"mock:hang:2", "timed out", RequestFailure::kTimedOut},
      {"mock:error_event:1", "server error in stream: mock failure", RequestFailure::kServerError},
  };
  std::vector<datasets::SampleRequest> reqs;
  for (const auto& c : cases) reqs.push_back(sample(c.prompt, 6));
  for (int i = 0; i < 5; ++i) reqs.push_back(sample("fine", 4));
  const RunResult r = run_plan(o, reqs, 3);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_FALSE(r.outputs[i].success) << cases[i].prompt;
    EXPECT_NE(r.outputs[i].error.find(cases[i].error), std::string::npos)
        << cases[i].prompt << " gave: " << r.outputs[i].error;
    EXPECT_EQ(r.outputs[i].failure, cases[i].failure) << cases[i].prompt << " gave: " << r.outputs[i].error;
  }
  for (size_t i = cases.size(); i < reqs.size(); ++i) {
    EXPECT_TRUE(r.outputs[i].success) << r.outputs[i].error;
    EXPECT_EQ(r.outputs[i].failure, RequestFailure::kNone);
  }
  const BenchmarkMetrics m = compute_metrics(r.outputs, r.duration_s, {99}, {});
  EXPECT_EQ(m.failed, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(m.completed, 5);
  EXPECT_EQ(m.failure_reasons.count("HTTP 429: {\"error\":{\"message\":\"mock status 429\",\"code\":429}}"), 1u);
}

// The timeout is per request: one handle running request after request for longer than the timeout in all (each
// well within it) fails none of them, while a hanging request on another handle times out meanwhile.
TEST(HttpClient, TimeoutCountsFromEachRequestsOwnStart) {
  MockServer server({"--itl-us", "1000"});
  HttpClientOptions o;
  o.api_url = server.url("/v1/completions");
  o.request_timeout_s = 1.0;
  std::vector<datasets::SampleRequest> reqs = {sample("mock:hang:1", 5)};
  for (int i = 0; i < 12; ++i) reqs.push_back(sample("fine", 100));  // about 0.1-0.2 s each
  const RunResult r = run_plan(o, reqs, 2);
  EXPECT_FALSE(r.outputs[0].success);
  EXPECT_NE(r.outputs[0].error.find("timed out after 1"), std::string::npos) << r.outputs[0].error;
  EXPECT_EQ(r.outputs[0].failure, RequestFailure::kTimedOut);
  for (size_t i = 1; i < reqs.size(); ++i) {
    ASSERT_TRUE(r.outputs[i].success) << i << ": " << r.outputs[i].error;
    EXPECT_EQ(r.outputs[i].output_tokens, 100);
  }
  EXPECT_GT(r.duration_s, o.request_timeout_s);  // the handle reuse this test is about did happen past a timeout
}

// One client, several runs: more streams than one connection shard holds, connections kept between runs (and
// found dead, then replaced, after the server restarts on the same port).
TEST(HttpClient, ConnectionsAreReusedAcrossRunsAndShards) {
  auto server = std::make_unique<MockServer>();
  const std::string url = server->url("/v1/completions");
  const std::string port = url.substr(url.rfind(':') + 1, url.find('/', url.rfind(':')) - url.rfind(':') - 1);
  HttpClientOptions o;
  o.api_url = url;
  HttpClient client(o);
  std::vector<datasets::SampleRequest> reqs;
  for (int i = 0; i < 300; ++i) reqs.push_back(sample("one two", 3 + i % 4));
  const auto run = [&](int64_t cap) {
    RunSpec spec;
    spec.max_concurrency = cap;
    for (const auto& r : reqs) spec.requests.push_back({&r, 0.0});
    const RunResult r = client.run(spec);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(r.outputs[i].success) << "cap " << cap << ": " << r.outputs[i].error;
      EXPECT_EQ(r.outputs[i].output_tokens, reqs[i].output_len);
      EXPECT_EQ(r.outputs[i].itl.size(), static_cast<size_t>(reqs[i].output_len - 1));
    }
  };
  {
    HttpClient fresh(o);  // nothing due at the start: the loop waits with no connection shard yet
    RunSpec spec;
    for (int i = 0; i < 3; ++i) spec.requests.push_back({&reqs[i], 0.02 + 0.01 * i});
    for (const RequestOutput& out : fresh.run(spec).outputs) EXPECT_TRUE(out.success) << out.error;
  }
  run(0);    // all 300 at once: several shards
  run(100);  // reuses the connections of the first run
  server.reset();
  server = std::make_unique<MockServer>(std::vector<std::string>{"--port", port});
  run(40);  // every kept connection is dead now
}

TEST(HttpClient, NothingListeningFailsEveryRequest) {
  int port = 0;
  {
    MockServer server;  // take a free port, then stop the server
    const std::string u = server.url("");
    port = std::stoi(u.substr(u.rfind(':') + 1));
  }
  HttpClientOptions o;
  o.api_url = "http://127.0.0.1:" + std::to_string(port) + "/v1/completions";
  std::vector<datasets::SampleRequest> reqs = {sample("a", 2), sample("b", 2)};
  const RunResult r = run_plan(o, reqs);
  for (const RequestOutput& out : r.outputs) {
    EXPECT_FALSE(out.success);
    EXPECT_NE(out.error.find("transport error"), std::string::npos) << out.error;
    EXPECT_EQ(out.failure, RequestFailure::kTransport);
  }
}

}  // namespace
}  // namespace servetune::loadgen

namespace servetune::loadgen {
namespace {

// Sessions over chat: the mock counts every message's words as prompt tokens and answers max_tokens " tok" words,
// so each turn's prompt_tokens shows whose replies its history held; its TTFT grows by a known delay per word.
std::vector<datasets::SampleRequest> word_sessions(int count, int turns) {
  std::vector<datasets::SampleRequest> v;
  for (int s = 0; s < count; ++s) {
    std::vector<ChatMessage> history;
    for (int t = 0; t < turns; ++t) {
      history.push_back({"user", "q w w"});
      datasets::SampleRequest r;
      r.messages = history;
      r.prompt = "unused by chat";
      r.prompt_len = 5 * t + 3;
      r.output_len = 4;
      r.session = s;
      r.turn = t;
      v.push_back(r);
      history.push_back({"assistant", "r r"});
    }
  }
  return v;
}

RunResult run_sessions(const MockServer& server, const std::vector<datasets::SampleRequest>& reqs, bool server_history,
                       double think) {
  HttpClientOptions o;
  o.backend = "openai-chat";
  o.api_url = server.url("/v1/chat/completions");
  o.model = "mock";
  HttpClient client(o);
  RunSpec spec;
  spec.sessions = true;
  spec.max_concurrency = 1;
  for (const auto& r : reqs) spec.requests.push_back({&r, 0.0, r.turn > 0 ? think : 0.0});
  if (server_history) {
    spec.render = [](datasets::SampleRequest& r) { r.prompt = "re-rendered"; };
  }
  return client.run(spec);
}

TEST(HttpClient, SessionsSendHistoriesInOrderAfterTheThinkTime) {
  MockServer server({"--ttft-us", "1000", "--ttft-us-per-word", "300"});
  const auto reqs = word_sessions(2, 3);
  for (const bool server_history : {false, true}) {
    SCOPED_TRACE(server_history ? "server history" : "dataset history");
    const double think = 0.03;
    const RunResult r = run_sessions(server, reqs, server_history, think);
    ASSERT_EQ(r.outputs.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      const RequestOutput& o = r.outputs[i];
      ASSERT_TRUE(o.success) << o.error;
      const int64_t t = reqs[i].turn;
      EXPECT_EQ(o.turn, t);
      EXPECT_EQ(o.session, reqs[i].session);
      // u0 a0 ... ut: 3 words a question, a reply 2 words from the dataset or 4 " tok" from the server.
      const int64_t words = 3 * (t + 1) + (server_history ? 4 : 2) * t;
      EXPECT_EQ(o.prompt_len, words) << i;
      EXPECT_GE(o.ttft, 1e-6 * static_cast<double>(1000 + 300 * words)) << i;
      if (t > 0) {
        const RequestOutput& prev = r.outputs[i - 1];
        const double reply_end = prev.start_time + prev.latency;
        EXPECT_GE(o.ready_time, reply_end + think - 1e-9) << i;  // the think time counts from the reply
        EXPECT_GE(o.start_time, o.ready_time) << i;
      }
    }
    // One user at a time: session 1 starts after session 0's last reply.
    EXPECT_GE(r.outputs[3].start_time, r.outputs[2].start_time + r.outputs[2].latency);
    const SessionMetrics s = compute_session_metrics(r.outputs, r.duration_s, {99});
    EXPECT_EQ(s.completed_sessions, 2);
    // Known delays: a first turn (3 words) waits >= 1.9 ms; later turns (8 and 13 words, or 10 and 17 with the
    // server's replies) >= 4.15 / 5.05 ms on average. Lower bounds only: a loaded machine only adds.
    EXPECT_GE(s.first_turn.ttft_ms.mean, 1.9);
    EXPECT_GE(s.later_turns.ttft_ms.mean, server_history ? 5.05 : 4.15);
    EXPECT_GE(s.session_time_ms.mean, 2 * think * 1000.0);
  }
}

}  // namespace
}  // namespace servetune::loadgen
