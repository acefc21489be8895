// Internals of HttpServer (included by http_server.cpp only): the shared server state and one HTTP connection.
// Each connection lives on its own strand; its deadline timer bounds every wait on the client (header, body, a
// blocked write) and is off while the server waits on the engine. While a request is being answered, an async_wait
// on the socket detects a client that hangs up, so its request is aborted at once rather than at the next write.
// Lifetime: the connection lives while one of its own operations is pending (exchanges hold it weakly, so an engine
// request that outlives the server keeps no socket); while a request is answered, the hold timer is that operation.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/prometheus.h"

namespace servetune::server::detail {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

constexpr auto kLingerTimeout = std::chrono::milliseconds(2000);
constexpr auto kForceCloseDelay = std::chrono::milliseconds(3000);
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(50);

// Lets the engine thread post to connections only while the io_context exists.
struct LoopGuard {
  std::mutex mutex;
  bool alive = true;
};

// The executor of one connection's strand, shared with its exchanges. The connection clears it when it goes (at
// the latest while the io_context is destroyed), so an exchange kept alive by an engine request that outlives the
// server never holds a strand of a dead io_context.
struct PostTarget {
  std::mutex mutex;
  std::optional<net::any_io_executor> executor;
};

class Connection;

struct ServerCore {
  ServerCore(const HttpOptions& o, HttpApp& a, ServerMetrics& m)
      : options(o), app(a), metrics(m), acceptor(ioc), accept_retry(ioc), shutdown_timer(ioc) {}
  ~ServerCore() { destroying = true; }  // runs before the members go: connections destroyed with ioc must not stop it

  void accept();
  void wait_signal();
  void run_loop();
  void on_accept(const error_code& ec, tcp::socket socket);
  void begin_shutdown();
  void remove(Connection* c);
  template <typename Fn>
  void for_each_connection(Fn fn);

  const HttpOptions options;
  HttpApp& app;
  ServerMetrics& metrics;
  std::shared_ptr<LoopGuard> guard = std::make_shared<LoopGuard>();
  std::mutex registry_mutex;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;
  std::atomic<bool> shutting_down{false};
  std::atomic<bool> destroying{false};
  net::io_context ioc;  // after the state above: handlers destroyed with it still find that state alive
  tcp::acceptor acceptor;
  net::steady_timer accept_retry;
  net::steady_timer shutdown_timer;
  std::optional<net::signal_set> signals;
};

inline std::string head(int status, const std::string& content_type, const std::vector<std::pair<std::string, std::string>>& extra,
                 bool keep_alive, bool http10) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + ' ' + status_reason(status) + "\r\nServer: servetune\r\n";
  if (!content_type.empty()) out += "Content-Type: " + content_type + "\r\n";
  for (const auto& [k, v] : extra) out += k + ": " + v + "\r\n";
  if (!keep_alive) {
    out += "Connection: close\r\n";
  } else if (http10) {
    out += "Connection: keep-alive\r\n";
  }
  return out;
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerCore& core)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), hold_(socket_.get_executor()), core_(core) {
    core_.metrics.connections_open.fetch_add(1, std::memory_order_relaxed);
    post_target_->executor = socket_.get_executor();
  }
  ~Connection() {
    {
      std::lock_guard lock(post_target_->mutex);
      post_target_->executor.reset();
    }
    core_.metrics.connections_open.fetch_sub(1, std::memory_order_relaxed);
    core_.remove(this);
  }

  net::any_io_executor executor() { return socket_.get_executor(); }
  void start() { read_request(); }

  void drain() {
    keep_alive_ = false;
    if (state_ == State::kReading) close();
  }
  void force_close() { close(); }

  bool exchange_open(uint64_t serial) const { return !closed_ && exchange_active_ && serial == serial_; }

  void reply(uint64_t serial, HttpResponse r) {
    if (!exchange_open(serial) || streaming_) return;
    core_.metrics.count_response(r.status);
    std::string out = head(r.status, r.content_type, r.headers, keep_alive_, http10_);
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n\r\n";
    out += r.body;
    end_exchange();
    queue(std::move(out));
  }

  void begin_stream(uint64_t serial) {
    if (!exchange_open(serial) || streaming_) return;
    core_.metrics.count_response(200);
    streaming_ = true;
    if (http10_) keep_alive_ = false;  // no chunked encoding for HTTP/1.0: the end of the body is the close
    std::string out = head(200, "text/event-stream; charset=utf-8", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}},
                           keep_alive_, http10_);
    if (!http10_) out += "Transfer-Encoding: chunked\r\n";
    out += "\r\n";
    queue(std::move(out));
  }

  void stream(uint64_t serial, const std::string& data) {
    if (!exchange_open(serial) || !streaming_ || data.empty()) return;
    if (http10_) {
      queue(data);
      return;
    }
    char size[20];
    const int n = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    std::string framed;
    framed.reserve(data.size() + static_cast<size_t>(n) + 2);
    framed.append(size, static_cast<size_t>(n));
    framed += data;
    framed += "\r\n";
    queue(std::move(framed));
  }

  void end_stream(uint64_t serial) {
    if (!exchange_open(serial) || !streaming_) return;
    end_exchange();
    queue(http10_ ? std::string() : std::string("0\r\n\r\n"));
  }

  void set_on_disconnect(uint64_t serial, std::function<void()> fn) {
    if (exchange_open(serial)) {
      on_disconnect_ = std::move(fn);
    } else if (serial == serial_ && closed_) {
      net::post(executor(), std::move(fn));
    }
  }

 private:
  enum class State { kReading, kHandling, kClosing };

  void arm(std::chrono::milliseconds timeout) {
    const uint64_t id = ++timer_id_;
    write_timer_armed_ = false;
    timer_.expires_after(timeout);
    timer_.async_wait([self = shared_from_this(), id](const error_code& ec) {
      if (!ec && id == self->timer_id_) self->close();
    });
  }
  void disarm() {
    ++timer_id_;
    write_timer_armed_ = false;
    timer_.cancel();
  }
  // Keeps the connection alive from dispatch to the end of the exchange. The peer watch cannot: it completes as soon
  // as a pipelined request is readable, and then, between writes, nothing else of ours may be pending.
  void hold() {
    hold_.expires_at(net::steady_timer::time_point::max());
    hold_.async_wait([self = shared_from_this()](const error_code&) {});
  }
  // The write deadline: a write in flight for write_timeout means the client stopped reading. One timer
  // covers a whole stream (it re-arms for the remaining time instead of being reset per token).
  void arm_write() {
    write_started_ = std::chrono::steady_clock::now();
    if (!write_timer_armed_) wait_write_deadline(core_.options.write_timeout);
  }
  void wait_write_deadline(std::chrono::steady_clock::duration after) {
    const uint64_t id = ++timer_id_;
    write_timer_armed_ = true;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), id](const error_code& ec) {
      if (ec || id != self->timer_id_) return;
      self->write_timer_armed_ = false;
      if (!self->write_in_flight_) return;
      const auto left = self->write_started_ + self->core_.options.write_timeout - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) return self->close();
      self->wait_write_deadline(left);
    });
  }

  void read_request() {
    state_ = State::kReading;
    streaming_ = false;
    if (core_.shutting_down.load()) {
      close();
      return;
    }
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(core_.options.max_header_bytes));
    parser_->body_limit(core_.options.max_body_bytes);
    if (buffer_.size() > 0) return read_header();  // a pipelined request is already here
    // Idle until the client sends something (keep-alive timeout), then the header must follow promptly.
    arm(core_.options.keep_alive_timeout);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
      if (ec || self->closed_) return self->close();
      self->read_header();
    });
  }

  void read_header() {
    arm(core_.options.header_timeout);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](const error_code& ec, size_t) { self->on_header(ec); });
  }

  void on_header(const error_code& ec) {
    if (ec) return on_read_error(ec);
    if (parser_->content_length() && *parser_->content_length() > core_.options.max_body_bytes) {
      return error_and_close(413, "request body of " + std::to_string(*parser_->content_length()) + " bytes exceeds the limit of " +
                                      std::to_string(core_.options.max_body_bytes));
    }
    if (parser_->is_done()) return dispatch();
    const auto expect = parser_->get()[http::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      error_code ignored;
      net::write(socket_, net::buffer("HTTP/1.1 100 Continue\r\n\r\n", 25), ignored);
    }
    arm(core_.options.body_timeout);
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](const error_code& e, size_t) {
      if (e) return self->on_read_error(e);
      self->dispatch();
    });
  }

  void on_read_error(const error_code& ec) {
    if (closed_) return;
    if (ec == http::error::header_limit) {
      return error_and_close(431, "request header exceeds " + std::to_string(core_.options.max_header_bytes) + " bytes");
    }
    if (ec == http::error::body_limit) {
      return error_and_close(413, "request body exceeds the limit of " + std::to_string(core_.options.max_body_bytes) + " bytes");
    }
    const bool parse_error = ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
                             ec != http::error::end_of_stream && ec != http::error::partial_message;
    if (parse_error) return error_and_close(400, std::string("malformed HTTP request: ") + ec.message());
    close();  // end of stream, reset, timeout: nobody to answer
  }

  void error_and_close(int status, const std::string& message) {
    keep_alive_ = false;
    http10_ = false;
    ++serial_;
    exchange_active_ = true;
    state_ = State::kHandling;
    disarm();
    hold();
    HttpResponse r;
    r.status = status;
    r.body = ApiError(status, message).body();
    reply(serial_, std::move(r));
  }

  void dispatch() {
    disarm();
    auto& req = parser_->get();
    HttpRequest r;
    r.method = std::string(req.method_string());
    const std::string_view target(req.target().data(), req.target().size());
    r.path = std::string(target.substr(0, target.find('?')));
    r.authorization = std::string(req[http::field::authorization]);
    r.body = std::move(req.body());
    r.arrival = EngineClock::now();
    http10_ = req.version() < 11;
    keep_alive_ = keep_alive_ && req.keep_alive() && !core_.shutting_down.load();
    ++serial_;
    exchange_active_ = true;
    state_ = State::kHandling;
    hold();
    watch_peer();
    auto exchange = std::make_shared<ExchangeImpl>(weak_from_this(), serial_, post_target_, core_.guard);
    try {
      core_.app.handle(std::move(r), exchange);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "servetune serve: internal error handling a request: %s\n", e.what());
      if (streaming_) {
        end_stream(serial_);
      } else {
        HttpResponse resp;
        resp.status = 500;
        resp.body = ApiError(500, std::string("internal error: ") + e.what()).body();
        reply(serial_, std::move(resp));
      }
    }
  }

  // Readable while we answer: EOF or an error means the client hung up; bytes mean a pipelined request (left
  // for the next read; we stop watching).
  void watch_peer() {
    watching_ = true;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), serial = serial_](const error_code& ec) {
      if (serial == self->serial_) self->watching_ = false;
      if (ec == net::error::operation_aborted || !self->exchange_open(serial)) return;
      error_code avail_ec;
      const size_t available = self->socket_.available(avail_ec);
      if (ec || avail_ec || available == 0) self->close();
    });
  }

  void end_exchange() {
    exchange_active_ = false;
    end_after_write_ = true;
    on_disconnect_ = nullptr;
    hold_.cancel();  // the write of the response's end holds the connection from here
  }

  void queue(std::string data) {
    out_ += data;
    if (!write_in_flight_) write_some();
  }

  void write_some() {
    if (closed_) return;
    if (out_.empty()) return on_write_idle();
    writing_.swap(out_);
    write_in_flight_ = true;
    arm_write();
    net::async_write(socket_, net::buffer(writing_), [self = shared_from_this()](const error_code& ec, size_t) {
      self->write_in_flight_ = false;
      self->writing_.clear();
      if (ec) return self->close();
      self->write_some();
    });
  }

  void on_write_idle() {
    if (!end_after_write_) return;  // streaming, waiting for the engine
    end_after_write_ = false;
    streaming_ = false;
    if (watching_) {
      error_code ignored;
      socket_.cancel(ignored);  // the peer watch; no write is in flight here
      watching_ = false;
    }
    if (keep_alive_ && !core_.shutting_down.load()) return read_request();
    graceful_close();
  }

  // Half-close, then read until the client closes (or a short timeout), so it receives our last bytes
  // rather than a reset caused by its unread request data.
  void graceful_close() {
    if (closed_) return;
    state_ = State::kClosing;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    arm(kLingerTimeout);
    drain_input();
  }
  void drain_input() {
    socket_.async_read_some(net::buffer(linger_buf_), [self = shared_from_this()](const error_code& ec, size_t) {
      if (ec) return self->close();
      self->drain_input();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    ++timer_id_;
    timer_.cancel();
    hold_.cancel();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    auto fn = std::move(on_disconnect_);
    on_disconnect_ = nullptr;
    const bool was_active = exchange_active_;
    exchange_active_ = false;
    if (was_active && fn) fn();
  }

  class ExchangeImpl : public Exchange {
   public:
    ExchangeImpl(std::weak_ptr<Connection> c, uint64_t serial, std::shared_ptr<PostTarget> target, std::shared_ptr<LoopGuard> guard)
        : conn_(std::move(c)), serial_(serial), target_(std::move(target)), guard_(std::move(guard)) {}
    void reply(HttpResponse r) override {
      if (auto c = conn_.lock()) c->reply(serial_, std::move(r));
    }
    void begin_stream() override {
      if (auto c = conn_.lock()) c->begin_stream(serial_);
    }
    void stream(std::string data) override {
      if (auto c = conn_.lock()) c->stream(serial_, data);
    }
    void end_stream() override {
      if (auto c = conn_.lock()) c->end_stream(serial_);
    }
    void on_disconnect(std::function<void()> fn) override {
      if (auto c = conn_.lock()) {
        c->set_on_disconnect(serial_, std::move(fn));
      } else {
        post(std::move(fn));
      }
    }
    void post(std::function<void()> fn) override {
      std::lock_guard lock(guard_->mutex);
      if (!guard_->alive) return;
      std::lock_guard target_lock(target_->mutex);
      if (target_->executor) net::post(*target_->executor, std::move(fn));
    }
    bool connected() const override {
      auto c = conn_.lock();
      return c && c->exchange_open(serial_);
    }

   private:
    std::weak_ptr<Connection> conn_;
    uint64_t serial_;
    std::shared_ptr<PostTarget> target_;
    std::shared_ptr<LoopGuard> guard_;
  };

  tcp::socket socket_;
  net::steady_timer timer_;
  net::steady_timer hold_;  // pending from dispatch to the end of the exchange (see hold())
  ServerCore& core_;
  std::shared_ptr<PostTarget> post_target_ = std::make_shared<PostTarget>();
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string out_;      // queued bytes
  std::string writing_;  // bytes of the write in flight
  std::array<char, 4096> linger_buf_{};
  std::function<void()> on_disconnect_;
  State state_ = State::kReading;
  uint64_t serial_ = 0;    // the current exchange
  uint64_t timer_id_ = 0;  // the current deadline
  std::chrono::steady_clock::time_point write_started_{};
  bool write_timer_armed_ = false;
  bool exchange_active_ = false;  // a request is being answered and its response is not complete
  bool streaming_ = false;
  bool end_after_write_ = false;
  bool write_in_flight_ = false;
  bool watching_ = false;
  bool keep_alive_ = true;
  bool http10_ = false;
  bool closed_ = false;
};


}  // namespace servetune::server::detail
