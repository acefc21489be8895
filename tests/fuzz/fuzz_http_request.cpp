// libFuzzer target: the HTTP server (Beast's request parser and servetune's connection state machine) on arbitrary
// bytes from one client over loopback. The app answers the way the real one does: at once, later from the executor
// (as an engine wake-up does), or as a stream. Each input is written, the client half-closes, and the server must
// answer with HTTP responses only, close the connection and release it (no hang, no leaked connection).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "server/http_server.h"
#include "server/prometheus.h"

namespace {

using namespace servetune::server;

class App : public HttpApp {
 public:
  void handle(HttpRequest request, std::shared_ptr<Exchange> ex) override {
    const std::string body = "{\"bytes\":" + std::to_string(request.body.size()) + "}";
    if (request.path == "/now") {
      HttpResponse r;
      r.body = body;
      ex->reply(std::move(r));
    } else if (request.path == "/stream") {
      ex->begin_stream();
      ex->stream("data: " + body + "\n\n");
      ex->post([ex] {
        ex->stream("data: [DONE]\n\n");
        ex->end_stream();
      });
    } else {
      ex->on_disconnect([] {});
      ex->post([ex, body] {
        HttpResponse r;
        r.body = body;
        ex->reply(std::move(r));
      });
    }
  }
  void abort_all() override {}
};

struct Harness {
  Harness() {
    HttpOptions o;
    o.port = 0;
    o.handle_signals = false;
    o.max_header_bytes = 1024;
    o.max_body_bytes = 4096;
    o.keep_alive_timeout = std::chrono::milliseconds(2000);
    o.header_timeout = std::chrono::milliseconds(2000);
    o.body_timeout = std::chrono::milliseconds(2000);
    o.write_timeout = std::chrono::milliseconds(2000);
    server = std::make_unique<HttpServer>(o, app, metrics);
    port = server->port();
    thread = std::thread([this] { server->run(); });
  }
  App app;
  ServerMetrics metrics;
  std::unique_ptr<HttpServer> server;
  uint16_t port = 0;
  std::thread thread;  // runs for the life of the process
};

Harness& harness() {
  static Harness* h = new Harness();  // never destroyed: the server thread outlives every input
  return *h;
}

// poll() for one descriptor that resumes after a signal: libFuzzer's -timeout watchdog sends SIGALRM every few
// seconds, and an interrupted wait is not a server that stopped answering.
int wait_for(pollfd& p, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (r >= 0 || errno != EINTR) return r;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness& h = harness();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) std::abort();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(h.port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    // libFuzzer's SIGALRM (its -timeout watchdog) can interrupt the connect; it completes in the background.
    if (errno != EINTR) std::abort();
    pollfd w{fd, POLLOUT, 0};
    if (wait_for(w, 8000) <= 0) std::abort();
  }
  // Inputs are small (libFuzzer's -max_len): the socket buffers take them whole, so writing before reading is safe.
  size_t off = 0;
  while (off < size) {
    const ssize_t n = ::send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may close early (a 400 or 413 ends the connection)
    off += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (wait_for(p, 8000) <= 0) std::abort();  // the server neither answered nor closed
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!got.empty() && got.rfind("HTTP/1.1 ", 0) != 0) std::abort();
  // The connection object goes once its last handler has run, just after the close.
  for (int i = 0; h.metrics.connections_open.load() != 0; ++i) {
    if (i > 8000) std::abort();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return 0;
}
