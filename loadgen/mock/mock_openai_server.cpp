// A small OpenAI-compatible streaming server for tests and the client benchmark: one epoll loop, HTTP/1.1
// keep-alive, chunked SSE for /v1/completions and /v1/chat/completions. It emits max_tokens chunks of " tok"
// (one every --itl-us, the first after --ttft-us plus --ttft-us-per-word per prompt word) and reports
// usage.prompt_tokens as the prompt's whitespace-separated word count (chat: of all messages; a token-id prompt: its
// length). A request without "stream": true gets the same text as one JSON body at once; like llama.cpp's server it
// ignores fields it does not know, vLLM's prompt_logprobs among them. Each event
// carries a "sent-ns:" line before its data (CLOCK_MONOTONIC nanoseconds when it was written to the socket buffer,
// see loadgen/sse_parser.h) unless --no-timestamps; the data payload is the same bytes either way.
// A prompt starting with "mock:MODE[:K]" injects a failure after K content chunks:
//   reset        connection reset (RST)          status:CODE  HTTP CODE with a JSON error body
//   malformed_sse  a payload line without "data:"  malformed_json  "data: {not json"
//   no_done      a complete stream without [DONE]  hang         stop sending (the client's timeout fires)
//   error_event  data: {"error": ...}             quirky       valid but unusual SSE (CRLF, comments,
//                                                               multi-line data, id/retry fields)
// --fail-every N answers every Nth completion request with HTTP 503 (a server failing a fraction of its requests).
// --prefix-cache pretends to cache prompts: cached tokens are the words of the longest earlier prompt a prompt starts
// with (usage.prompt_tokens_details.cached_tokens and vLLM's vllm:prefix_cache_* counters); POST /flush_cache (SGLang's
// name) forgets them.
// GET /metrics is a Prometheus exposition; with --spec-decode-tokens K it has vLLM's speculative-decoding counters
// of a pretend speculator: each streamed request of N tokens adds N drafts of K tokens whose first token is accepted.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/sse_parser.h"

namespace {

using Clock = std::chrono::steady_clock;

enum class Mode { kOk, kReset, kStatus, kMalformedSse, kMalformedJson, kNoDone, kHang, kErrorEvent, kQuirky };

struct Stream {
  bool chat = false;
  Mode mode = Mode::kOk;
  int fail_after = 0;  // content chunks before the failure
  int status = 0;
  int64_t total = 0;
  int64_t sent = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = -1;  // with --prefix-cache
  bool include_usage = false;
  uint64_t id = 0;
  bool active = false;
  bool started = false;  // the --ttft-us delay has passed
  std::string event;     // "data: ...\n\n" of an ordinary content event (built once per stream)
};

struct Conn {
  int fd = -1;
  std::string in;
  std::string out;
  size_t out_off = 0;
  Stream stream;
  uint64_t generation = 0;  // invalidates timers of earlier streams on this connection
  bool close_when_flushed = false;
  bool reset_when_flushed = false;
};

struct Timer {
  Clock::time_point at;
  int fd;
  uint64_t generation;
  bool operator>(const Timer& o) const { return at > o.at; }
};

int64_t g_itl_us = 0;
int64_t g_ttft_us = 0;
int64_t g_ttft_us_per_word = 0;
// --prefix-cache: a pretend prefix cache over prompt text. A prompt's cached tokens are the words of the longest
// earlier prompt it starts with; counted in usage.prompt_tokens_details and vLLM's prefix-cache counters.
bool g_prefix_cache = false;
std::vector<std::string> g_prompts_seen;
int64_t g_prefix_queries = 0;
int64_t g_prefix_hits = 0;  // added to the TTFT per prompt word: longer histories answer later, as prefill does
int64_t g_spec_tokens = 0;  // --spec-decode-tokens: draft length of the pretend speculator (0: none)
int64_t g_fail_every = 0;   // --fail-every N: every Nth completion request is answered 503 (0: none)
int64_t g_completion_requests = 0;
int64_t g_spec_drafts = 0;  // drafts so far; each accepts its first token only
bool g_timestamps = true;
int g_epfd = -1;
uint64_t g_next_id = 0;
std::unordered_map<int, Conn> g_conns;
std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> g_timers;

void add_chunk(Conn& c, const std::string& payload) {
  char head[32];
  std::snprintf(head, sizeof(head), "%zx\r\n", payload.size());
  c.out += head;
  c.out += payload;
  c.out += "\r\n";
}

// The send stamp of the events being generated: taken just before a timer's event or a batch that pump() writes
// with one send, so it is at most one batch's generation time early.
int64_t g_stamp_ns = 0;

// One SSE event ("data: ...\n\n") as one HTTP chunk, with the "sent-ns:" line in front when stamps are on.
void emit(Conn& c, std::string_view event) {
  char stamp[40] = "sent-ns: ";
  char* end = stamp + 9;
  if (g_timestamps) {
    end = std::to_chars(end, stamp + sizeof(stamp) - 1, g_stamp_ns).ptr;
    *end++ = '\n';
  }
  const size_t n = g_timestamps ? static_cast<size_t>(end - stamp) : 0;
  char head[24];
  char* h = std::to_chars(head, head + sizeof(head) - 2, n + event.size(), 16).ptr;
  *h++ = '\r';
  *h++ = '\n';
  c.out.append(head, static_cast<size_t>(h - head));
  c.out.append(stamp, n);
  c.out += event;
  c.out += "\r\n";
}

void sse(Conn& c, const std::string& json) { emit(c, "data: " + json + "\n\n"); }

std::string content_json(const Stream& s, bool last) {
  const std::string id = std::to_string(s.id);
  const char* finish = last ? "\"length\"" : "null";
  if (s.chat) {
    return "{\"id\":\"chatcmpl-" + id + "\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"mock\","
           "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},\"logprobs\":null,\"finish_reason\":" +
           finish + "}]}";
  }
  return "{\"id\":\"cmpl-" + id + "\",\"object\":\"text_completion\",\"created\":0,\"model\":\"mock\","
         "\"choices\":[{\"index\":0,\"text\":\" tok\",\"logprobs\":null,\"finish_reason\":" + finish +
         ",\"stop_reason\":null}],\"usage\":null}";
}

void close_conn(int fd, bool reset) {
  if (reset) {
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  }
  epoll_ctl(g_epfd, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  g_conns.erase(fd);
}

constexpr size_t kHighWater = 64 * 1024;  // buffered bytes per connection before waiting for the socket

bool step(Conn& c);

// Generates (when streaming without a per-token delay) and writes as much as the socket takes; registers
// EPOLLOUT while bytes remain.
void pump(Conn& c) {
  const int fd = c.fd;
  for (;;) {
    if (g_itl_us == 0 && c.stream.active && c.stream.started) {
      g_stamp_ns = servetune::loadgen::sent_ns_clock();
      while (c.stream.active && c.out.size() - c.out_off < kHighWater && step(c)) {
      }
    }
    while (c.out_off < c.out.size()) {
      const ssize_t w = send(fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        close_conn(fd, false);
        return;
      }
      c.out_off += static_cast<size_t>(w);
    }
    if (c.out_off < c.out.size()) break;  // socket full
    c.out.clear();
    c.out_off = 0;
    if (c.reset_when_flushed || c.close_when_flushed) {
      close_conn(fd, c.reset_when_flushed);
      return;
    }
    if (!(g_itl_us == 0 && c.stream.active && c.stream.started)) break;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | (c.out.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
  ev.data.fd = fd;
  epoll_ctl(g_epfd, EPOLL_CTL_MOD, fd, &ev);
}

// Emits the stream's next event(s); returns false when the stream has ended or stalled.
bool step(Conn& c) {
  Stream& s = c.stream;
  if (s.mode != Mode::kOk && s.mode != Mode::kNoDone && s.mode != Mode::kQuirky && s.sent == s.fail_after) {
    switch (s.mode) {
      case Mode::kReset:
        c.reset_when_flushed = true;
        break;
      case Mode::kMalformedSse:
        add_chunk(c, content_json(s, false) + "\n\n");
        break;
      case Mode::kMalformedJson:
        add_chunk(c, "data: {not json\n\n");
        break;
      case Mode::kErrorEvent:
        sse(c, "{\"error\":{\"message\":\"mock failure\",\"type\":\"internal_error\",\"code\":500}}");
        break;
      default:
        break;  // kHang: send nothing more
    }
    s.active = false;
    if (s.mode == Mode::kMalformedSse || s.mode == Mode::kMalformedJson || s.mode == Mode::kErrorEvent) {
      add_chunk(c, "data: [DONE]\n\n");
      c.out += "0\r\n\r\n";
    }
    return false;
  }
  if (s.sent < s.total) {
    ++s.sent;
    if (s.mode == Mode::kQuirky) {
      const std::string j = content_json(s, s.sent == s.total);
      const size_t cut = j.find("\"choices\"");
      const std::string stamp = g_timestamps ? "sent-ns: " + std::to_string(g_stamp_ns) + "\r\n" : "";
      add_chunk(c, ": keep-alive\r\nid: " + std::to_string(s.sent) + "\r\n" + stamp + "retry: 1000\r\ndata:" +
                       j.substr(0, cut) + "\r\ndata: " + j.substr(cut) + "\r\n\r\n");
    } else if (s.sent < s.total) {
      if (s.event.empty()) s.event = "data: " + content_json(s, false) + "\n\n";
      emit(c, s.event);
    } else {
      sse(c, content_json(s, true));
    }
    return true;
  }
  if (s.include_usage) {
    const std::string id = std::to_string(s.id);
    sse(c, std::string("{\"id\":\"") + (s.chat ? "chatcmpl-" : "cmpl-") + id +
               "\",\"object\":\"" + (s.chat ? "chat.completion.chunk" : "text_completion") +
               "\",\"created\":0,\"model\":\"mock\",\"choices\":[],\"usage\":{\"prompt_tokens\":" +
               std::to_string(s.prompt_tokens) + ",\"total_tokens\":" + std::to_string(s.prompt_tokens + s.total) +
               ",\"completion_tokens\":" + std::to_string(s.total) +
               (s.cached_tokens >= 0 ? ",\"prompt_tokens_details\":{\"cached_tokens\":" + std::to_string(s.cached_tokens) + "}"
                                     : std::string()) +
               "}}");
  }
  if (s.mode != Mode::kNoDone) emit(c, "data: [DONE]\n\n");
  c.out += "0\r\n\r\n";
  s.active = false;
  return false;
}

// A timer fired for this connection's stream: start it, or emit its next chunk.
void on_stream_timer(Conn& c) {
  c.stream.started = true;
  if (g_itl_us == 0) return;  // pump() generates the whole stream
  g_stamp_ns = servetune::loadgen::sent_ns_clock();
  if (step(c) && c.stream.active) {
    g_timers.push({Clock::now() + std::chrono::microseconds(g_itl_us), c.fd, c.generation});
  }
}

int64_t word_count(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (char ch : s) {
    const bool space = ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

void respond_status(Conn& c, int code, const std::string& message) {
  const std::string body = "{\"error\":{\"message\":\"" + message + "\",\"code\":" + std::to_string(code) + "}}";
  c.out += "HTTP/1.1 " + std::to_string(code) + " Error\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A non-streaming answer: every token at once, in one completion (or chat completion) body.
void respond_whole(Conn& c, const Stream& s) {
  std::string text;
  for (int64_t i = 0; i < s.total; ++i) text += " tok";
  const std::string choice = s.chat ? R"({"index":0,"message":{"role":"assistant","content":")" + text + R"("},)"
                                    : R"({"index":0,"text":")" + text + R"(",)";
  const std::string body = std::string(R"({"id":"cmpl-mock-)") + std::to_string(s.id) + R"(","object":")" +
                           (s.chat ? "chat.completion" : "text_completion") + R"(","created":0,"model":"mock","choices":[)" + choice +
                           R"("logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":)" + std::to_string(s.prompt_tokens) +
                           R"(,"completion_tokens":)" + std::to_string(s.total) + R"(,"total_tokens":)" +
                           std::to_string(s.prompt_tokens + s.total) + "}}";
  c.out += "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string metrics_text() {
  std::string t = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"mock\"} 0\n";
  if (g_prefix_cache) {
    t += "vllm:prefix_cache_queries_total{model_name=\"mock\"} " + std::to_string(g_prefix_queries) + "\n";
    t += "vllm:prefix_cache_hits_total{model_name=\"mock\"} " + std::to_string(g_prefix_hits) + "\n";
  }
  if (g_spec_tokens <= 0) return t;
  const std::string drafts = std::to_string(g_spec_drafts);
  const std::string draft_tokens = std::to_string(g_spec_drafts * g_spec_tokens);
  t += "vllm:spec_decode_num_drafts_total{model_name=\"mock\"} " + drafts + "\n";
  t += "vllm:spec_decode_num_draft_tokens_total{model_name=\"mock\"} " + draft_tokens + "\n";
  t += "vllm:spec_decode_num_accepted_tokens_total{model_name=\"mock\"} " + drafts + "\n";
  for (int64_t p = 0; p < g_spec_tokens; ++p) {
    t += "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"mock\",position=\"" + std::to_string(p) +
         "\"} " + (p == 0 ? drafts : "0") + "\n";
  }
  return t;
}

void handle_request(Conn& c, const std::string& method, const std::string& path, const std::string& body) {
  if (method == "GET" && (path == "/v1/models" || path == "/metrics")) {
    const bool models = path == "/v1/models";
    const std::string b =
        models ? R"({"object":"list","data":[{"id":"mock","object":"model","root":"mock"}]})" : metrics_text();
    c.out += std::string("HTTP/1.1 200 OK\r\nContent-Type: ") + (models ? "application/json" : "text/plain") +
             "\r\nContent-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b;
    return;
  }
  if (method == "POST" && path == "/flush_cache") {  // SGLang's: the pretend prefix cache forgets every prompt
    g_prompts_seen.clear();
    std::printf("flushed the prefix cache\n");  // to its log: tests count the flushes
    std::fflush(stdout);
    c.out += "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n\r\nCache flushed.";
    return;
  }
  const bool chat = path == "/v1/chat/completions";
  if (method != "POST" || (!chat && path != "/v1/completions")) return respond_status(c, 404, "not found");
  if (g_fail_every > 0 && ++g_completion_requests % g_fail_every == 0) return respond_status(c, 503, "mock --fail-every");
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return respond_status(c, 400, "bad JSON body");
  Stream s;
  s.chat = chat;
  s.id = ++g_next_id;
  std::string prompt;
  if (chat) {
    // Every message counts toward the prompt (a multi-turn history); a failure mode is read from the first.
    if (j.contains("messages") && j["messages"].is_array()) {
      for (const auto& m : j["messages"]) prompt += (prompt.empty() ? "" : " ") + m.value("content", "");
    }
    s.total = j.value("max_completion_tokens", j.value("max_tokens", 16));
  } else {
    if (j.contains("prompt") && j["prompt"].is_string()) prompt = j["prompt"].get<std::string>();
    s.total = j.value("max_tokens", 16);
  }
  s.include_usage = j.contains("stream_options") && j["stream_options"].value("include_usage", false);
  s.prompt_tokens = !chat && j.contains("prompt") && j["prompt"].is_array() ? static_cast<int64_t>(j["prompt"].size()) : word_count(prompt);
  if (g_prefix_cache) {
    s.cached_tokens = 0;
    for (const std::string& p : g_prompts_seen) {
      if (prompt.rfind(p, 0) == 0) s.cached_tokens = std::max(s.cached_tokens, word_count(p));
    }
    g_prompts_seen.push_back(prompt);
    g_prefix_queries += s.prompt_tokens;
    g_prefix_hits += s.cached_tokens;
  }
  if (prompt.rfind("mock:", 0) == 0) {
    const std::string spec = prompt.substr(5, prompt.find_first_of(" \n") - 5);
    const std::string mode = spec.substr(0, spec.find(':'));
    const size_t colon = spec.find(':');
    const int arg = colon == std::string::npos ? 0 : std::atoi(spec.c_str() + colon + 1);
    s.fail_after = arg;
    if (mode == "reset") s.mode = Mode::kReset;
    if (mode == "malformed_sse") s.mode = Mode::kMalformedSse;
    if (mode == "malformed_json") s.mode = Mode::kMalformedJson;
    if (mode == "no_done") s.mode = Mode::kNoDone;
    if (mode == "hang") s.mode = Mode::kHang;
    if (mode == "error_event") s.mode = Mode::kErrorEvent;
    if (mode == "quirky") s.mode = Mode::kQuirky;
    if (mode == "status") return respond_status(c, arg, "mock status " + std::to_string(arg));
  }
  if (s.total < 1) return respond_status(c, 400, "max_tokens must be >= 1");
  if (!j.value("stream", false)) return respond_whole(c, s);
  c.out += "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
           "Transfer-Encoding: chunked\r\n\r\n";
  s.active = true;
  if (s.mode == Mode::kOk || s.mode == Mode::kQuirky) g_spec_drafts += s.total;
  c.stream = s;
  ++c.generation;
  if (const int64_t ttft = g_ttft_us + g_ttft_us_per_word * s.prompt_tokens; ttft > 0) {
    g_timers.push({Clock::now() + std::chrono::microseconds(ttft), c.fd, c.generation});
  } else {
    on_stream_timer(c);
  }
}

// Parses whole requests out of c.in (Content-Length bodies only) while no stream is running.
void process_input(Conn& c) {
  while (!c.stream.active) {
    const size_t hdr_end = c.in.find("\r\n\r\n");
    if (hdr_end == std::string::npos) return;
    const std::string head = c.in.substr(0, hdr_end);
    const size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
    if (sp1 == std::string::npos || sp2 == std::string::npos) {
      c.close_when_flushed = true;
      respond_status(c, 400, "bad request line");
      return;
    }
    size_t content_length = 0;
    std::string lower = head;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const size_t cl = lower.find("\r\ncontent-length:");
    if (cl != std::string::npos) content_length = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
    if (c.in.size() < hdr_end + 4 + content_length) return;
    const std::string body = c.in.substr(hdr_end + 4, content_length);
    c.in.erase(0, hdr_end + 4 + content_length);
    handle_request(c, head.substr(0, sp1), head.substr(sp1 + 1, sp2 - sp1 - 1), body);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  std::string host = "127.0.0.1";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--no-timestamps") {
      g_timestamps = false;
      --i;
    } else if (a == "--prefix-cache") {
      g_prefix_cache = true;
      --i;
    } else if (i + 1 == argc) {
      std::fprintf(stderr, "mock: %s needs a value\n", a.c_str());
      return 2;
    } else if (a == "--port") {
      port = std::atoi(argv[i + 1]);
    } else if (a == "--host") {
      host = argv[i + 1];
    } else if (a == "--itl-us") {
      g_itl_us = std::atoll(argv[i + 1]);
    } else if (a == "--ttft-us") {
      g_ttft_us = std::atoll(argv[i + 1]);
    } else if (a == "--ttft-us-per-word") {
      g_ttft_us_per_word = std::atoll(argv[i + 1]);
    } else if (a == "--spec-decode-tokens") {
      g_spec_tokens = std::atoll(argv[i + 1]);
    } else if (a == "--fail-every") {
      g_fail_every = std::atoll(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--host H] [--port P] [--itl-us N] [--ttft-us N] [--ttft-us-per-word N] "
                   "[--spec-decode-tokens K] "
                   "[--fail-every N] [--prefix-cache] [--no-timestamps]\n", argv[0]);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(lfd, 65535) != 0) {
    std::fprintf(stderr, "mock: cannot listen on %s:%d: %s\n", host.c_str(), port, std::strerror(errno));
    return 1;
  }
  socklen_t len = sizeof(addr);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::printf("listening on %s:%d\n", host.c_str(), ntohs(addr.sin_port));
  std::fflush(stdout);

  g_epfd = epoll_create1(EPOLL_CLOEXEC);
  epoll_event lev{};
  lev.events = EPOLLIN;
  lev.data.fd = lfd;
  epoll_ctl(g_epfd, EPOLL_CTL_ADD, lfd, &lev);
  std::vector<epoll_event> events(1024);
  char buf[65536];
  for (;;) {
    int timeout_ms = -1;
    if (!g_timers.empty()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(g_timers.top().at - Clock::now()).count();
      timeout_ms = static_cast<int>(std::max<int64_t>(left, 0));
    }
    const int n = epoll_wait(g_epfd, events.data(), static_cast<int>(events.size()), timeout_ms);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == lfd) {
        for (;;) {
          const int cfd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (cfd < 0) break;
          setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          Conn& c = g_conns[cfd];
          c = Conn{};
          c.fd = cfd;
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.fd = cfd;
          epoll_ctl(g_epfd, EPOLL_CTL_ADD, cfd, &ev);
        }
        continue;
      }
      auto it = g_conns.find(fd);
      if (it == g_conns.end()) continue;
      Conn& c = it->second;
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        bool closed = false;
        for (;;) {
          const ssize_t r = recv(fd, buf, sizeof(buf), 0);
          if (r > 0) {
            c.in.append(buf, static_cast<size_t>(r));
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closed = true;
          break;
        }
        if (closed) {
          close_conn(fd, false);
          continue;
        }
        process_input(c);
      }
      if (g_conns.count(fd) != 0) pump(c);
    }
    const auto now = Clock::now();
    while (!g_timers.empty() && g_timers.top().at <= now) {
      const Timer t = g_timers.top();
      g_timers.pop();
      auto it = g_conns.find(t.fd);
      if (it == g_conns.end() || it->second.generation != t.generation || !it->second.stream.active) continue;
      on_stream_timer(it->second);
      pump(it->second);
    }
  }
}
