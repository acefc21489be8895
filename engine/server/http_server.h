// A small asynchronous HTTP/1.1 server (Boost.Asio + Beast's parser) for the OpenAI routes: a fixed pool of I/O
// threads serves every connection; limits on header and body size, connections and idle time; chunked streaming
// responses; client-disconnect notification; graceful drain on SIGINT/SIGTERM. No Boost types in this header.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "servetune/request.h"

namespace servetune::server {

struct ServerMetrics;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query string
  std::string authorization;
  std::string body;
  EngineClock::time_point arrival;  // when the whole request had been read
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra: Retry-After, WWW-Authenticate, Allow
};

// The reply side of one request. reply / begin_stream / stream / end_stream / on_disconnect must run on the
// connection's executor: inside HttpApp::handle or in a function given to post(). They do nothing once the
// client is gone. post() may be called from any thread (the engine thread) and never blocks for long.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void reply(HttpResponse response) = 0;
  virtual void begin_stream() = 0;  // 200 text/event-stream, chunked
  virtual void stream(std::string data) = 0;
  virtual void end_stream() = 0;
  // `fn` runs once, on the executor, if the client disconnects before the reply is complete.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  virtual void post(std::function<void()> fn) = 0;
  virtual bool connected() const = 0;
};

class HttpApp {
 public:
  virtual ~HttpApp() = default;
  virtual void handle(HttpRequest request, std::shared_ptr<Exchange> exchange) = 0;
  // Shutdown: the grace period ran out (or a second signal came); end every request in flight now.
  virtual void abort_all() = 0;
};

struct HttpOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (see HttpServer::port)
  int io_threads = 1;
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = 8 * 1024 * 1024;
  int max_connections = 8192;
  std::chrono::milliseconds keep_alive_timeout{30000};  // an idle connection waiting for its next request
  std::chrono::milliseconds header_timeout{10000};      // from the first byte of a request to the end of its header
  std::chrono::milliseconds body_timeout{30000};       // reading a request body
  std::chrono::milliseconds write_timeout{30000};      // a client that stops reading
  std::chrono::milliseconds shutdown_timeout{30000};   // in-flight requests may finish within this after SIGTERM
  bool handle_signals = true;                          // SIGINT / SIGTERM start a graceful shutdown
};

class HttpServer {
 public:
  // Binds and listens; throws Error(kIo) naming the address when that fails.
  HttpServer(const HttpOptions& options, HttpApp& app, ServerMetrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;
  // Serves on `io_threads` threads (this one included) until shutdown completes.
  void run();
  // Thread-safe, same as SIGTERM: stop accepting, close idle connections, let requests in flight finish within
  // shutdown_timeout, then HttpApp::abort_all(); run() returns when every connection is closed.
  void shutdown();
  bool shutting_down() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace servetune::server
