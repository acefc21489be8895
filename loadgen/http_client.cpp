// libcurl-multi + epoll streaming client (see http_client.h). One thread: the loop launches requests when their
// arrival time comes (timerfd) and a concurrency slot is free, hands socket readiness to curl, and reads
// finished transfers. Easy handles are pooled so keep-alive connections are reused.
#include "loadgen/http_client.h"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>

#include "loadgen/backends.h"
#include "loadgen/dispatcher.h"
#include "loadgen/sse_parser.h"
#include "servetune/error.h"

namespace servetune::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

std::string snippet(std::string_view s, size_t n = 200) {
  std::string out(s.substr(0, n));
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (s.size() > n) out += "...";
  return out;
}

struct Loop;

// One curl multi handle and its connection cache. libcurl 7.88 walks every connection of the cache when it looks
// for one to reuse and again when a transfer is removed, so one cache holding 10,000 connections costs O(n) per
// request; the loop spreads requests over shards of at most kShardConnections transfers instead, and skips the
// first walk (CURLOPT_FRESH_CONNECT) when the shard has no idle connection, which it knows from its socket count.
struct Shard {
  Loop* loop = nullptr;
  uint32_t index = 0;
  CURLM* multi = nullptr;
  bool dirty = false;  // curl ran on it since its finished transfers were last read
  int64_t inflight = 0;
  int64_t sockets = 0;  // open sockets of this shard's connections, busy or idle (open/close socket callbacks)
};

struct Loop {
  int epfd = -1;
  Clock::time_point t0;
  double io_time = -1.0;  // taken just before handing a ready socket to curl: the arrival time of what it reads
  std::vector<std::unique_ptr<Shard>> shards;
  std::vector<Shard*> dirty;
  // When curl wants CURL_SOCKET_TIMEOUT on each shard (time_point::max(): never), contiguous because the loop
  // scans them after every epoll_wait.
  std::vector<Clock::time_point> deadlines;
  double now_s() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
};

// Hands socket readiness (or CURL_SOCKET_TIMEOUT) to a shard's multi handle.
void socket_action(Shard& shard, curl_socket_t s, int flags) {
  int running = 0;
  curl_multi_socket_action(shard.multi, s, flags, &running);
  if (!shard.dirty) {
    shard.dirty = true;
    shard.loop->dirty.push_back(&shard);
  }
}

constexpr int64_t kShardConnections = 32;
constexpr uint64_t kTimerTag = ~0ull;  // epoll data of the arrival timerfd

struct Transfer {
  CURL* easy = nullptr;
  const Loop* loop = nullptr;
  Shard* shard = nullptr;  // while in flight
  ApiKind api = ApiKind::kCompletions;
  bool keep_text = true;
  char errbuf[CURL_ERROR_SIZE] = {};
  size_t index = 0;
  uint64_t launch = 0;  // which launch of this handle is in flight (a timeout names the launch it is for)
  RequestOutput* out = nullptr;
  SseParser sse;
  StreamChunkParser chunks;
  StreamChunk chunk;
  bool status_known = false;
  long status = 0;
  std::string error_body;
  std::string error;
  RequestFailure failure = RequestFailure::kNone;
  bool done = false;
  bool first = false;
  double last_ts = 0.0;

  void reset(size_t i, RequestOutput* o) {
    index = i;
    out = o;
    sse.reset();
    status_known = false;
    status = 0;
    error_body.clear();
    error.clear();
    failure = RequestFailure::kNone;
    done = first = false;
    errbuf[0] = '\0';
  }

  void fail(RequestFailure kind, std::string message) {
    failure = kind;
    error = std::move(message);
  }

  void on_event(const SseEvent& ev, double now) {
    if (!error.empty() || done) return;
    if (ev.sent_ns >= 0) {
      if (out->read_lags.empty()) out->read_lags.reserve(out->itl.capacity() + 2);  // one per event, with usage, [DONE]
      out->read_lags.push_back(static_cast<double>(sent_ns_clock() - ev.sent_ns) * 1e-9);
    }
    if (ev.type == "error") {
      fail(RequestFailure::kServerError, "server error event: " + snippet(ev.data));
      return;
    }
    chunks.parse(ev.data, api, chunk);
    if (!chunk.error.empty()) {
      fail(chunk.server_error ? RequestFailure::kServerError : RequestFailure::kBadResponse, chunk.error);
      return;
    }
    if (chunk.done) {
      done = true;
      return;
    }
    if (chunk.has_choices) {
      if (!first) {
        first = true;
        out->ttft = now - out->start_time;
      } else {
        out->itl.push_back(now - last_ts);
      }
      last_ts = now;
      if (keep_text) out->generated_text += chunk.text;
    }
    if (chunk.has_usage) {
      if (chunk.completion_tokens >= 0) out->output_tokens = chunk.completion_tokens;
      if (chunk.prompt_tokens >= 0) out->prompt_len = chunk.prompt_tokens;
      if (chunk.cached_tokens >= 0) out->cached_tokens = chunk.cached_tokens;
    }
  }
};

size_t on_write(char* ptr, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nmemb;
  if (!t->status_known) {
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
    t->status_known = true;
  }
  if (t->status != 200) {
    if (t->error_body.size() < 4096) t->error_body.append(ptr, std::min<size_t>(n, 4096 - t->error_body.size()));
    return n;
  }
  const double now = t->loop->io_time >= 0.0 ? t->loop->io_time : t->loop->now_s();
  t->sse.feed(std::string_view(ptr, n), [&](const SseEvent& ev) { t->on_event(ev, now); });
  if (t->error.empty() && t->sse.malformed() > 0) {
    t->fail(RequestFailure::kBadResponse, "malformed SSE: " + snippet(t->sse.first_malformed()));
  }
  return t->error.empty() ? n : 0;  // 0 makes curl abort the transfer
}

int on_socket(CURL*, curl_socket_t s, int what, void* userp, void* socketp) {
  auto* shard = static_cast<Shard*>(userp);
  const int epfd = shard->loop->epfd;
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, s, nullptr);
    return 0;
  }
  epoll_event ev{};
  ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
  ev.data.u64 = (static_cast<uint64_t>(shard->index) << 32) | static_cast<uint32_t>(s);
  int op = socketp == nullptr ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  if (epoll_ctl(epfd, op, s, &ev) != 0) {
    op = op == EPOLL_CTL_ADD ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    epoll_ctl(epfd, op, s, &ev);
  }
  if (socketp == nullptr) curl_multi_assign(shard->multi, s, reinterpret_cast<void*>(1));
  return 0;
}

// Sockets are opened and closed here so that each shard knows how many connections it holds (clientp: the shard
// the connection belongs to; libcurl keeps the close callback's pointer with the connection).
curl_socket_t on_open_socket(void* clientp, curlsocktype, curl_sockaddr* a) {
  const int fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  if (fd < 0) return CURL_SOCKET_BAD;
  ++static_cast<Shard*>(clientp)->sockets;
  return fd;
}

int on_close_socket(void* clientp, curl_socket_t fd) {
  --static_cast<Shard*>(clientp)->sockets;
  return close(fd);
}

int on_timer(CURLM*, long timeout_ms, void* userp) {
  auto* shard = static_cast<Shard*>(userp);
  shard->loop->deadlines[shard->index] =
      timeout_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
  return 0;
}

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

}  // namespace

long raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return -1;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit want = lim;
    want.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) lim = want;
  }
  return static_cast<long>(lim.rlim_cur);
}

// What outlives a run: the event loop's epoll set, the shards with their connection caches and the easy handles.
struct HttpClient::Pool {
  Loop loop;
  curl_slist* headers = nullptr;
  std::vector<std::unique_ptr<Transfer>> transfers;
  std::vector<Transfer*> idle;
  std::vector<Shard*> freed;  // shards where a transfer finished, most recent last: their connection is idle
  size_t cursor = 0;          // where the search for a shard with a free slot starts

  ~Pool() {
    for (auto& sh : loop.shards) curl_multi_cleanup(sh->multi);
    for (auto& t : transfers) curl_easy_cleanup(t->easy);
    curl_slist_free_all(headers);
    if (loop.epfd >= 0) close(loop.epfd);
  }

  Shard* add_shard() {
    auto shard = std::make_unique<Shard>();
    shard->loop = &loop;
    shard->index = static_cast<uint32_t>(loop.shards.size());
    loop.deadlines.push_back(Clock::time_point::max());
    shard->multi = curl_multi_init();
    if (shard->multi == nullptr) throw Error(ErrorKind::kIo, "cannot create a curl multi handle");
    curl_multi_setopt(shard->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(shard->multi, CURLMOPT_SOCKETDATA, shard.get());
    curl_multi_setopt(shard->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(shard->multi, CURLMOPT_TIMERDATA, shard.get());
    curl_multi_setopt(shard->multi, CURLMOPT_MAXCONNECTS, static_cast<long>(kShardConnections + 16));
    loop.shards.push_back(std::move(shard));
    return loop.shards.back().get();
  }

  // Where the next transfer goes: a shard where one just finished (its connection is reused without connecting),
  // else the first shard with a free slot from the cursor on, else a new shard.
  Shard* pick_shard() {
    while (!freed.empty()) {
      Shard* sh = freed.back();
      freed.pop_back();
      if (sh->inflight < kShardConnections) return sh;
    }
    for (size_t k = 0; k < loop.shards.size(); ++k, cursor = (cursor + 1) % loop.shards.size()) {
      if (loop.shards[cursor]->inflight < kShardConnections) return loop.shards[cursor].get();
    }
    return add_shard();
  }

  void add_transfers(size_t n, const HttpClientOptions& o) {
    while (transfers.size() < n) {
      auto t = std::make_unique<Transfer>();
      t->easy = curl_easy_init();
      if (t->easy == nullptr) throw Error(ErrorKind::kIo, "cannot create a curl easy handle");
      t->loop = &loop;
      t->api = backend_api(o.backend);
      CURL* e = t->easy;
      curl_easy_setopt(e, CURLOPT_URL, o.api_url.c_str());
      curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
      curl_easy_setopt(e, CURLOPT_POST, 1L);
      curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
      curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
      curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
      curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
      curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
      curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
      curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
      curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
      idle.push_back(t.get());
      transfers.push_back(std::move(t));
    }
  }

  // Starts `t` on the least busy shard: a fresh connection when the shard has no idle one (no cache walk).
  void launch(Transfer* t, const std::string& body) {
    Shard* shard = pick_shard();
    t->shard = shard;
    CURL* e = t->easy;
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, shard);
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, shard);
    curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, shard->sockets <= shard->inflight ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_multi_add_handle(shard->multi, e);
    ++shard->inflight;
    socket_action(*shard, CURL_SOCKET_TIMEOUT, 0);
  }
};

HttpClient::HttpClient(HttpClientOptions options) : options_(std::move(options)) {
  static CurlGlobal global;
  if (!is_http_backend(options_.backend)) throw_usage("unknown HTTP backend '" + options_.backend + "'");
  validate_endpoint(options_.backend, options_.api_url);
  if (!(options_.request_timeout_s > 0.0)) throw_usage("--request-timeout must be > 0");
  pool_ = std::make_unique<Pool>();
  pool_->loop.epfd = epoll_create1(EPOLL_CLOEXEC);
  if (pool_->loop.epfd < 0) throw Error(ErrorKind::kIo, "cannot create the event loop");
  pool_->headers = curl_slist_append(pool_->headers, "Content-Type: application/json");
  pool_->headers = curl_slist_append(pool_->headers, "Expect:");
  if (!options_.api_key.empty()) {
    pool_->headers = curl_slist_append(pool_->headers, ("Authorization: Bearer " + options_.api_key).c_str());
  }
}

HttpClient::~HttpClient() = default;

RunResult HttpClient::run(const RunSpec& spec) {
  const size_t n = spec.requests.size();
  RunResult result;
  result.outputs.resize(n);
  if (n == 0) return result;
  Pool& pool = *pool_;
  Loop& loop = pool.loop;
  // The run's clock starts before its request bodies and first handles are made: its duration includes that
  // setup, and requests due at the start show it as send lag.
  loop.t0 = Clock::now();
  // Bodies are made before the run, except those of turns re-rendered with the server's replies (at their launch).
  std::vector<std::string> bodies;
  bodies.reserve(n);
  for (const PlannedRequest& p : spec.requests) {
    const bool later_turn = spec.render && spec.sessions && p.sample->turn > 0;
    bodies.push_back(later_turn ? std::string() : request_body(options_.backend, options_.model, *p.sample, spec.params));
  }
  Dispatcher dispatch(spec, result.outputs);

  const int timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timerfd < 0) throw Error(ErrorKind::kIo, "cannot create the event loop");
  epoll_event tev{};
  tev.events = EPOLLIN;
  tev.data.u64 = kTimerTag;
  epoll_ctl(loop.epfd, EPOLL_CTL_ADD, timerfd, &tev);
  const int64_t cap = spec.max_concurrency > 0 ? std::min<int64_t>(spec.max_concurrency, static_cast<int64_t>(n))
                                               : static_cast<int64_t>(n);
  // Idle connections left by earlier runs, one entry each (the list of a finished run is not kept: it can be long).
  pool.freed.clear();
  for (const auto& sh : loop.shards) pool.freed.insert(pool.freed.end(), std::max<int64_t>(sh->sockets, 0), sh.get());
  // Handles for the requests due at the start are made at once; more are made when needed.
  size_t due_at_start = 0;
  while (due_at_start < static_cast<size_t>(cap) && spec.requests[due_at_start].scheduled_s <= 0.0) ++due_at_start;
  pool.add_transfers(due_at_start, options_);

  // Request timeouts, kept here rather than by curl (CURLOPT_TIMEOUT_MS puts every transfer in its multi handle's
  // timer tree, which curl rebalances on each socket action). One timeout for all requests, so launch order is
  // deadline order and a queue holds them; a finished or relaunched transfer's entry is skipped when it comes up.
  struct RequestDeadline {
    double at;
    Transfer* t;
    uint64_t launch;
  };
  std::deque<RequestDeadline> request_deadlines;
  uint64_t launches = 0;
  const auto finish = [&](Transfer* t, CURLcode res) {
    RequestOutput& o = *t->out;
    const double now = loop.now_s();
    if (t->error.empty()) {
      long status = t->status;
      if (!t->status_known) curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
      if (res == CURLE_OPERATION_TIMEDOUT) {
        t->fail(RequestFailure::kTimedOut,
                "request timed out after " + std::to_string(options_.request_timeout_s) + " s");
      } else if (res != CURLE_OK) {
        t->fail(RequestFailure::kTransport,
                std::string("transport error: ") + (t->errbuf[0] != '\0' ? t->errbuf : curl_easy_strerror(res)));
      } else if (status != 200) {
        t->fail(RequestFailure::kHttpStatus,
                "HTTP " + std::to_string(status) + (t->error_body.empty() ? "" : ": " + snippet(t->error_body)));
      } else {
        t->sse.finish([&](const SseEvent& ev) { t->on_event(ev, now); });
        if (t->error.empty()) {
          if (!t->first) {
            t->fail(RequestFailure::kBadResponse, "Never received a valid chunk to calculate TTFT.");
          } else if (!t->done) {
            t->fail(RequestFailure::kBadResponse, "stream ended without [DONE]");
          }
        }
      }
    }
    o.success = t->error.empty();
    o.failure = t->failure;
    o.error = t->error;
    o.latency = t->first ? t->last_ts - o.start_time : 0.0;
    --t->shard->inflight;
    pool.freed.push_back(t->shard);
    t->shard = nullptr;
    t->out = nullptr;
    pool.idle.push_back(t);
    dispatch.finished(t->index, now);
  };
  const auto drain_done = [&](Shard& shard) {
    CURLMsg* msg = nullptr;
    int left = 0;
    while ((msg = curl_multi_info_read(shard.multi, &left)) != nullptr) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* easy = msg->easy_handle;
      const CURLcode res = msg->data.result;
      Transfer* t = nullptr;
      curl_easy_getinfo(easy, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
      curl_multi_remove_handle(shard.multi, easy);
      finish(t, res);
    }
  };
  // Finished transfers are read before any launch, so that a shard's count of transfers in flight (and with it
  // the choice between reusing an idle connection and opening a fresh one) is never stale.
  const auto drain = [&] {
    while (!loop.dirty.empty()) {
      Shard* sh = loop.dirty.back();
      loop.dirty.pop_back();
      sh->dirty = false;
      drain_done(*sh);
    }
  };
  const auto launch_due = [&] {
    drain();
    while (const auto l = dispatch.next(loop.now_s())) {
      const size_t i = l->index;
      RequestOutput& o = result.outputs[i];
      if (l->rendered || bodies[i].empty()) bodies[i] = request_body(options_.backend, options_.model, *l->sample, spec.params);
      o.itl.reserve(static_cast<size_t>(std::max<int64_t>(l->sample->output_len, 1)));
      if (pool.idle.empty()) pool.add_transfers(pool.transfers.size() + 1, options_);
      Transfer* t = pool.idle.back();
      pool.idle.pop_back();
      t->reset(i, &o);
      t->keep_text = spec.keep_text;
      o.start_time = loop.now_s();
      t->launch = ++launches;
      request_deadlines.push_back({o.start_time + options_.request_timeout_s, t, t->launch});
      pool.launch(t, bodies[i]);
    }
  };

  // Aborts the requests whose timeout has passed (after reading finished transfers: one that completed in time is
  // not failed for a message not yet read).
  const auto expire_requests = [&] {
    if (request_deadlines.empty() || request_deadlines.front().at > loop.now_s()) return;
    drain();
    const double now = loop.now_s();
    while (!request_deadlines.empty() && request_deadlines.front().at <= now) {
      const RequestDeadline d = request_deadlines.front();
      request_deadlines.pop_front();
      if (d.t->out == nullptr || d.t->launch != d.launch) continue;  // finished in time
      curl_multi_remove_handle(d.t->shard->multi, d.t->easy);
      finish(d.t, CURLE_OPERATION_TIMEDOUT);
    }
  };

  constexpr int kMaxEvents = 512;
  std::vector<epoll_event> events(kMaxEvents);
  double armed_for = -1.0;  // the due time the arrival timer is set for
  while (!dispatch.done()) {
    launch_due();
    if (dispatch.done()) break;
    if (const double due = dispatch.next_time(); due < std::numeric_limits<double>::infinity() && due != armed_for) {
      itimerspec its{};
      const auto at = loop.t0 + std::chrono::ceil<Clock::duration>(std::chrono::duration<double>(due));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
      its.it_value.tv_sec = std::max<int64_t>(ns / 1000000000, 0);
      its.it_value.tv_nsec = std::max<int64_t>(ns % 1000000000, 1);
      timerfd_settime(timerfd, TFD_TIMER_ABSTIME, &its, nullptr);
      armed_for = due;
    }
    auto deadline = std::min_element(loop.deadlines.begin(), loop.deadlines.end());
    auto wake = deadline != loop.deadlines.end() ? *deadline : Clock::time_point::max();
    if (!request_deadlines.empty()) {
      wake = std::min(wake, loop.t0 + std::chrono::ceil<Clock::duration>(
                                         std::chrono::duration<double>(request_deadlines.front().at)));
    }
    int timeout_ms = -1;
    if (wake != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 24 * 3600 * 1000));
    }
    const int nev = epoll_wait(loop.epfd, events.data(), kMaxEvents, timeout_ms);
    for (int i = 0; i < nev; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kTimerTag) {
        uint64_t expirations = 0;
        [[maybe_unused]] const ssize_t r = read(timerfd, &expirations, sizeof(expirations));
        armed_for = -1.0;  // re-armed next round if a request still waits
        continue;
      }
      int flags = 0;
      if (events[i].events & EPOLLIN) flags |= CURL_CSELECT_IN;
      if (events[i].events & EPOLLOUT) flags |= CURL_CSELECT_OUT;
      if (events[i].events & (EPOLLERR | EPOLLHUP)) flags |= CURL_CSELECT_ERR;
      Shard& shard = *loop.shards[tag >> 32];
      loop.io_time = loop.now_s();
      socket_action(shard, static_cast<curl_socket_t>(tag & 0xffffffffu), flags);
      loop.io_time = -1.0;
      if ((i & 3) == 3) launch_due();  // arrivals stay on time during a long batch
    }
    const auto now = Clock::now();
    for (size_t k = 0; k < loop.deadlines.size(); ++k) {
      if (now >= loop.deadlines[k]) {
        loop.deadlines[k] = Clock::time_point::max();
        socket_action(*loop.shards[k], CURL_SOCKET_TIMEOUT, 0);
      }
    }
    expire_requests();
  }
  result.duration_s = loop.now_s();
  epoll_ctl(loop.epfd, EPOLL_CTL_DEL, timerfd, nullptr);
  close(timerfd);
  return result;
}

}  // namespace servetune::loadgen
