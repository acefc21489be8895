// The HTTP server in-process on stories260K over loopback, driven by a raw-socket client: routing and error statuses,
// keep-alive and pipelining, chunked bodies, size limits, idle timeouts, API keys, queue limits, client disconnects
// (the engine request is aborted and its KV blocks freed), HTTP/1.0 streaming, graceful shutdown, long prompts
// prepared off the I/O thread, and n > 1 choices.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <span>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/server.h"
#include "servetune/engine.h"
#include "servetune/sampling.h"
#include "servetune/tokenizer.h"
#include "test_paths.h"

namespace servetune::server {
namespace {

using nlohmann::json;
constexpr int kWaitMs = 30000;  // generous liveness bound, not a timing assertion

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) ADD_FAILURE() << "connect failed";
  }
  ~RawClient() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  // Reads more bytes into the buffer; false on EOF, error or timeout.
  bool fill() {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, kWaitMs) <= 0) return false;
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    buf_.append(buf, static_cast<size_t>(n));
    return true;
  }
  bool peer_closed() {
    while (fill()) {
    }
    return true;
  }
  std::string line() {
    size_t pos;
    while ((pos = buf_.find("\r\n")) == std::string::npos) {
      if (!fill()) return {};
    }
    std::string l = buf_.substr(0, pos);
    buf_.erase(0, pos + 2);
    return l;
  }
  std::string take(size_t n) {
    while (buf_.size() < n) {
      if (!fill()) break;
    }
    std::string out = buf_.substr(0, n);
    buf_.erase(0, std::min(n, buf_.size()));
    return out;
  }
  Response head() {
    Response r;
    const std::string status = line();
    if (status.size() < 12) return r;
    r.status = std::stoi(status.substr(9, 3));
    for (std::string l = line(); !l.empty(); l = line()) {
      const size_t colon = l.find(':');
      std::string name = l.substr(0, colon);
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = l.substr(colon + 2);
    }
    return r;
  }
  // The next body chunk of a chunked response ("" at the end).
  std::string chunk() {
    const std::string size = line();
    if (size.empty()) return {};
    const size_t n = std::stoul(size, nullptr, 16);
    std::string data = take(n);
    line();
    return data;
  }
  Response response() {
    Response r = head();
    if (r.headers.count("content-length")) {
      r.body = take(std::stoul(r.headers["content-length"]));
    } else if (r.headers.count("transfer-encoding") && r.headers["transfer-encoding"] == "chunked") {
      for (std::string c = chunk(); !c.empty(); c = chunk()) r.body += c;
    } else {
      while (fill()) {
      }
      r.body = std::move(buf_);
      buf_.clear();
    }
    return r;
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

std::string post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}
std::string chunked(const std::string& data) {
  char size[16];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}
std::string get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: t\r\n" + extra + "\r\n";
}

class ServerHttp : public ::testing::Test {
 protected:
  void start(ServerOptions o = {}, int max_running = 8) {
    EngineConfig c;
    c.model = testing::stories_path();
    c.threads = 1;
    c.max_running_requests = max_running;
    engine_ = std::make_unique<Engine>(c);
    o.http.port = 0;
    o.http.handle_signals = false;
    server_ = std::make_unique<Server>(*engine_, o);
    port_ = server_->port();
    thread_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    if (server_) server_->shutdown();
    if (thread_.joinable()) thread_.join();
    server_.reset();
    engine_.reset();
  }
  Response request(const std::string& raw) {
    RawClient c(port_);
    c.send(raw);
    return c.response();
  }
  // Polls `holds` every 10 ms for up to kWaitMs; true once it holds.
  template <class Pred>
  static bool eventually(Pred holds) {
    for (int i = 0; i < kWaitMs / 10; ++i) {
      if (holds()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  bool engine_holds_nothing() const {
    const EngineStats s = engine_->stats();
    return s.running == 0 && s.waiting == 0 && s.kv_blocks_used == 0;
  }
  // Waits until the engine holds no request and no KV block.
  bool engine_idle() {
    return eventually([&] { return engine_holds_nothing(); });
  }
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  uint16_t port_ = 0;
};

const std::string kLong = R"({"prompt":"Once upon a time","max_tokens":1500,"ignore_eos":true,"stream":true})";

// The JSON payloads of an SSE body, without the final [DONE].
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while ((pos = body.find("data: {", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(json::parse(body.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  return out;
}

TEST_F(ServerHttp, RoutesAndErrorStatuses) {
  start();
  Response r = request(get("/health"));
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body.empty());
  r = request(get("/v1/models"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["data"][0]["id"], "stories260K.gguf");
  r = request(get("/v1/models/nope"));
  EXPECT_EQ(r.status, 404);
  r = request(get("/nope?x=1"));
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(json::parse(r.body)["error"].contains("message"));
  r = request(get("/v1/completions"));
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "POST");
  r = request(post("/v1/completions", "{not json"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error");
  r = request(post("/v1/completions", R"({"model":"gpt-4","prompt":"x"})"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "model_not_found");
  r = request(post("/v1/completions", R"({"prompt":"x","max_tokens":100000})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "max_tokens");
  r = request(post("/v1/completions", R"({"prompt":[1,2,99999]})"));
  EXPECT_EQ(r.status, 400);
  r = request(post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})"));
  EXPECT_EQ(r.status, 400);  // stories260K has no chat template
  EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("chat template"), std::string::npos);
  r = request("BREW /pot HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(r.status, 404);
  r = request("GARBAGE\r\n\r\n");
  EXPECT_EQ(r.status, 400);
  r = request(get("/metrics"));
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("vllm:num_requests_running{"), std::string::npos);
  EXPECT_NE(r.body.find("servetune:http_responses_total{model_name=\"stories260K.gguf\",status=\"404\"}"), std::string::npos);
}

// SGLang's /flush_cache (GET or POST) and vLLM's /reset_prefix_cache (POST): a repeated prompt's cached blocks are
// forgotten, so its next request computes the whole prompt again.
TEST_F(ServerHttp, FlushCacheEndpointsForgetThePrefixCache) {
  start();
  const std::string body = R"({"prompt":"Once upon a time, there was a little girl named Lily. She liked to play outside","max_tokens":2})";
  const auto cached = [&] {
    const Response r = request(post("/v1/completions", body));
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  };
  cached();
  EXPECT_GT(cached(), 0);
  Response r = request(post("/flush_cache", ""));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_GT(json::parse(r.body)["flushed_blocks"].get<int64_t>(), 0);
  EXPECT_EQ(cached(), 0);
  EXPECT_EQ(request(get("/flush_cache")).status, 200);
  EXPECT_EQ(request(post("/reset_prefix_cache", "")).status, 200);
  r = request(get("/reset_prefix_cache"));
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "POST");
}

TEST_F(ServerHttp, KeepAlivePipeliningAndChunkedBodies) {
  start();
  RawClient c(port_);
  c.send(get("/health") + get("/v1/models"));  // pipelined
  EXPECT_EQ(c.response().status, 200);
  EXPECT_EQ(c.response().status, 200);
  const std::string body = R"({"prompt":"Once upon","max_tokens":3,"temperature":0})";
  c.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(body.substr(0, 10)) +
         chunked(body.substr(10)) + "0\r\n\r\n");
  Response r = c.response();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 3);
  c.send(post("/v1/completions", body, "Expect: 100-continue\r\n"));
  EXPECT_EQ(c.head().status, 100);
  EXPECT_EQ(c.response().status, 200);
  c.send(get("/health", "Connection: close\r\n"));
  EXPECT_EQ(c.response().status, 200);
  EXPECT_TRUE(c.peer_closed());
}

// Six requests in one write, each longer than Beast's first read, so that most of them still wait in the socket when
// the first is dispatched (its peer watch then sees bytes and stops at once): every one is answered, in order.
TEST_F(ServerHttp, PipelinedRequestsAreAllAnsweredInOrder) {
  start();
  RawClient c(port_);
  std::string all;
  for (int i = 1; i <= 6; ++i) {
    const bool stream = i % 2 == 0;
    all += post("/v1/completions", R"({"prompt":"Once upon a time","temperature":0,"ignore_eos":true,"max_tokens":)" +
                                       std::to_string(i) + (stream ? R"(,"stream":true,"stream_options":{"include_usage":true})" : "") +
                                       std::string(2048, ' ') + "}");
  }
  c.send(all);
  for (int i = 1; i <= 6; ++i) {
    const Response r = c.response();
    ASSERT_EQ(r.status, 200) << "response " << i << ": " << r.body;
    const json usage = i % 2 == 0 ? sse_events(r.body).back()["usage"] : json::parse(r.body)["usage"];
    EXPECT_EQ(usage["completion_tokens"], i) << r.body;
  }
  c.send(get("/health", "Connection: close\r\n"));
  EXPECT_EQ(c.response().status, 200);
  EXPECT_TRUE(engine_idle());
}

// A number beyond a double is the client's mistake on every route that reads JSON.
TEST_F(ServerHttp, NumberOverflowIs400) {
  start();
  for (const char* path : {"/v1/completions", "/tokenize"}) {
    const Response r = request(post(path, R"({"prompt":"x","max_tokens":1e400})"));
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("number overflow"), std::string::npos) << r.body;
  }
  EXPECT_EQ(request(post("/detokenize", R"({"tokens":[1,-1e400]})")).status, 400);
}

// A prompt that takes long to tokenize is prepared on a worker thread: while it is (servetune:requests_preparing
// shows it), /metrics and /health answer on other connections. An I/O thread that tokenized could answer neither.
TEST_F(ServerHttp, ALongPromptDoesNotHoldUpOtherConnections) {
  start();
  std::string text;
  // 256 KiB: about half a second of tokenizing in a release build, many seconds in the ASan one; both far longer
  // than a /metrics poll, and far shorter than the liveness bound.
  while (text.size() < (256 << 10)) text += "Once upon a time there was a little girl who liked to play. ";
  RawClient big(port_);
  big.send(post("/tokenize", json{{"prompt", text}}.dump()));
  EXPECT_TRUE(eventually([&] {
    return request(get("/metrics")).body.find("servetune:requests_preparing{model_name=\"stories260K.gguf\"} 1\n") !=
           std::string::npos;
  }));
  EXPECT_EQ(request(get("/health")).status, 200);
  const Response r = big.response();
  ASSERT_EQ(r.status, 200);
  EXPECT_GT(json::parse(r.body)["count"].get<int64_t>(), 50000);
}

// n choices: indexed 0..n-1, each an independent sampled sequence (choice i of seed s draws as seed s + i, as in vLLM),
// usage counting the prompt once and every choice's tokens; streamed, the same choices arrive interleaved.
TEST_F(ServerHttp, SeveralChoicesStreamingAndNot) {
  start();
  const std::string base = R"({"prompt":"Once upon a time","max_tokens":12,"temperature":1.0,"ignore_eos":true)";
  Response r = request(post("/v1/completions", base + R"(,"seed":7,"n":3})"));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  std::vector<std::string> texts;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
    texts.push_back(j["choices"][i]["text"]);
  }
  EXPECT_FALSE(texts[0] == texts[1] && texts[1] == texts[2]) << texts[0];
  EXPECT_EQ(j["usage"]["completion_tokens"], 36);
  r = request(post("/v1/completions", base + R"(,"seed":8})"));
  ASSERT_EQ(r.status, 200) << r.body;
  const json single = json::parse(r.body);
  EXPECT_EQ(single["choices"][0]["text"], texts[1]);
  EXPECT_EQ(j["usage"]["prompt_tokens"], single["usage"]["prompt_tokens"]);

  r = request(post("/v1/completions", base + R"(,"seed":7,"n":3,"best_of":3,"stream":true,"stream_options":{"include_usage":true}})"));
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> streamed(3);
  std::vector<std::string> finish(3);
  const std::vector<json> events = sse_events(r.body);
  for (const json& e : events) {
    for (const json& c : e["choices"]) {
      const size_t i = c["index"];
      ASSERT_LT(i, 3u);
      streamed[i] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish[i] = c["finish_reason"];
    }
  }
  EXPECT_EQ(streamed, texts);
  EXPECT_EQ(finish, std::vector<std::string>(3, "length"));
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 36);
  EXPECT_NE(r.body.find("data: [DONE]\n\n"), std::string::npos);

  r = request(post("/v1/completions", base + R"(,"n":2,"best_of":3})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "best_of");
  EXPECT_TRUE(engine_idle());
}

// prompt_logprobs (vLLM's extension) over HTTP: one entry per prompt token, each position's values those of the
// engine's own teacher-forced logits rows (Request::prompt_logits, log-softmax), the same list in every choice, and
// the generation itself unchanged; a long prompt computed in several chunks gives every position.
TEST_F(ServerHttp, PromptLogprobsEqualTheEnginesPromptLogits) {
  start();
  const std::vector<int32_t> prompt = engine_->tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. She liked to play outside in the park with her friends.", true);
  constexpr int kTop = 5;
  const std::string body = R"({"prompt":)" + json(prompt).dump() + R"(,"max_tokens":3,"temperature":0,"n":2,"prompt_logprobs":5})";
  const Response r = request(post("/v1/completions", body));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  const json& lists = j["choices"][0]["prompt_logprobs"];
  EXPECT_EQ(j["choices"][1]["prompt_logprobs"], lists);
  ASSERT_EQ(lists.size(), prompt.size());
  EXPECT_TRUE(lists[0].is_null());

  Request direct;
  direct.prompt_ids = prompt;
  direct.prompt_logits = true;
  direct.sampling.temperature = 0.0f;
  direct.sampling.max_tokens = 3;
  auto stream = engine_->submit(direct);
  std::vector<float> rows;
  std::string text;
  while (auto e = stream->next()) {
    rows.insert(rows.end(), e->prompt_logits.begin(), e->prompt_logits.end());
    text += e->text;
    if (e->finish != FinishReason::kNone) break;
  }
  EXPECT_EQ(j["choices"][0]["text"], text);  // greedy: asking for the prompt's log-probabilities changes nothing else
  const auto vocab = static_cast<size_t>(engine_->model_info().vocab);
  ASSERT_EQ(rows.size(), (prompt.size() - 1) * vocab);
  std::vector<double> lp;
  for (size_t p = 1; p < prompt.size(); ++p) {
    SCOPED_TRACE("position " + std::to_string(p));
    log_softmax(std::span<const float>(rows.data() + (p - 1) * vocab, vocab), lp);
    const json& entry = lists[p];
    const std::string key = std::to_string(prompt[p]);
    ASSERT_TRUE(entry.contains(key)) << entry.dump();
    EXPECT_NEAR(entry[key]["logprob"].get<double>(), lp[static_cast<size_t>(prompt[p])], 1e-6);
    const double target = lp[static_cast<size_t>(prompt[p])];
    EXPECT_EQ(entry[key]["rank"].get<int64_t>(), std::count_if(lp.begin(), lp.end(), [&](double x) { return x >= target; }));
    std::vector<double> sorted = lp;
    std::sort(sorted.rbegin(), sorted.rend());
    EXPECT_GE(entry.size(), static_cast<size_t>(kTop));
    EXPECT_LE(entry.size(), static_cast<size_t>(kTop) + 1);
    for (const auto& [id, v] : entry.items()) {
      EXPECT_NEAR(v["logprob"].get<double>(), lp[std::stoul(id)], 1e-6) << id;
      EXPECT_EQ(v["decoded_token"], engine_->tokenizer().token_to_piece(std::stoi(id)));
      if (id != key) {  // a top-K entry: its rank is its place in the sorted row
        EXPECT_NEAR(v["logprob"].get<double>(), sorted[v["rank"].get<size_t>() - 1], 1e-6) << id;
      }
    }
  }
  const Response bad = request(post("/v1/completions", R"({"prompt":[1,2],"prompt_logprobs":21})"));
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(json::parse(bad.body)["error"]["param"], "prompt_logprobs");
  EXPECT_TRUE(engine_idle());
}

// A client that leaves aborts every choice of its request.
TEST_F(ServerHttp, DisconnectAbortsEveryChoice) {
  start();
  {
    RawClient c(port_);
    c.send(post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":1500,"ignore_eos":true,"stream":true,"n":3})"));
    ASSERT_EQ(c.head().status, 200);
    EXPECT_NE(c.chunk().find("data: "), std::string::npos);
  }
  EXPECT_TRUE(engine_idle());
  EXPECT_GE(engine_->stats().requests_aborted, 3);
}

TEST_F(ServerHttp, SizeLimitsAndIdleTimeouts) {
  ServerOptions o;
  o.http.max_body_bytes = 4096;
  o.http.max_header_bytes = 1024;
  o.http.keep_alive_timeout = std::chrono::milliseconds(200);
  o.http.header_timeout = std::chrono::milliseconds(200);
  start(o);
  Response r = request(post("/v1/completions", R"({"prompt":")" + std::string(5000, 'a') + "\"}"));
  EXPECT_EQ(r.status, 413);
  r = request("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 999999999\r\n\r\n");
  EXPECT_EQ(r.status, 413);
  r = request("GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(2000, 'b') + "\r\n\r\n");
  EXPECT_EQ(r.status, 431);
  {
    RawClient idle(port_);  // says nothing: closed after the keep-alive timeout
    EXPECT_TRUE(idle.peer_closed());
  }
  {
    RawClient slow(port_);  // half a header, then silence
    slow.send("GET /health HTTP/1.1\r\nHost: t\r\n");
    EXPECT_TRUE(slow.peer_closed());
  }
  EXPECT_EQ(request(get("/health")).status, 200);
}

TEST_F(ServerHttp, ApiKeyGuardsTheApiButNotHealthOrMetrics) {
  ServerOptions o;
  o.api_key = "sekrit";
  start(o);
  Response r = request(get("/v1/models"));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.headers["www-authenticate"], "Bearer");
  EXPECT_EQ(request(get("/v1/models", "Authorization: Bearer wrong\r\n")).status, 401);
  EXPECT_EQ(request(post("/tokenize", R"({"prompt":"x"})")).status, 401);
  EXPECT_EQ(request(get("/v1/models", "Authorization: Bearer sekrit\r\n")).status, 200);
  r = request(post("/tokenize", R"({"prompt":"Once upon"})", "Authorization: Bearer sekrit\r\n"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["tokens"], json({1, 403, 407}));
  EXPECT_EQ(request(get("/health")).status, 200);
  EXPECT_EQ(request(get("/metrics")).status, 200);
}

TEST_F(ServerHttp, ClientDisconnectAbortsTheRequestAndFreesItsBlocks) {
  start();
  for (int i = 0; i < 3; ++i) {
    RawClient c(port_);
    c.send(post("/v1/completions", kLong));
    ASSERT_EQ(c.head().status, 200);
    EXPECT_NE(c.chunk().find("data: "), std::string::npos);
    c.close();
  }
  {
    RawClient c(port_);  // gone before the first token
    c.send(post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":1500,"ignore_eos":true})"));
  }
  // The server may take up the last request only after the engine first looks idle here: wait until nothing is in
  // flight at the HTTP level and the engine is idle again.
  EXPECT_TRUE(eventually([&] {
    const Response m = request(get("/metrics"));
    return m.body.find("servetune:requests_in_flight{model_name=\"stories260K.gguf\"} 0\n") != std::string::npos &&
           engine_holds_nothing();
  }));
  EXPECT_GE(engine_->stats().requests_aborted, 3);
}

TEST_F(ServerHttp, QueueFullIs503WithRetryAfter) {
  ServerOptions o;
  o.max_queued_requests = 0;
  start(o, /*max_running=*/1);
  RawClient first(port_);
  first.send(post("/v1/completions", kLong));
  ASSERT_EQ(first.head().status, 200);
  Response r = request(post("/v1/completions", R"({"prompt":"x","max_tokens":2})"));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "queue_full");
  first.close();
  EXPECT_TRUE(engine_idle());
}

TEST_F(ServerHttp, StreamingEqualsNonStreamingAndHttp10Works) {
  start();
  Response whole = request(post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":40,"temperature":0})"));
  ASSERT_EQ(whole.status, 200);
  const std::string text = json::parse(whole.body)["choices"][0]["text"];

  RawClient c(port_);
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":40,"temperature":0,"stream":true})";
  c.send("POST /v1/completions HTTP/1.0\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  Response s = c.response();  // no chunked encoding for HTTP/1.0: the body ends with the connection
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(s.headers.count("transfer-encoding"), 0u);
  std::string streamed;
  size_t pos = 0;
  while ((pos = s.body.find("data: {", pos)) != std::string::npos) {
    const size_t end = s.body.find("\n\n", pos);
    streamed += json::parse(s.body.substr(pos + 6, end - pos - 6))["choices"][0]["text"].get<std::string>();
    pos = end;
  }
  EXPECT_EQ(streamed, text);
  EXPECT_NE(s.body.find("data: [DONE]\n\n"), std::string::npos);
}

TEST_F(ServerHttp, ShutdownLetsRequestsFinishThenAbortsStragglers) {
  ServerOptions o;
  o.http.shutdown_timeout = std::chrono::milliseconds(300);
  start(o);
  RawClient c(port_);
  c.send(post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":2000,"ignore_eos":true,"stream":true})"));
  ASSERT_EQ(c.head().status, 200);
  server_->shutdown();
  std::string all;
  for (std::string ch = c.chunk(); !ch.empty(); ch = c.chunk()) all += ch;
  EXPECT_NE(all.find("\"finish_reason\":"), std::string::npos);
  EXPECT_NE(all.find("data: [DONE]"), std::string::npos);
  thread_.join();  // run() returned
  EXPECT_TRUE(engine_idle());
}

}  // namespace
}  // namespace servetune::server
