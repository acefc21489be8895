// HttpServer on Boost.Asio with Beast's request parser: the acceptor, connection registry, signals and graceful
// shutdown. The per-connection protocol lives in http_connection.h.
#include "server/http_server.h"

#include <signal.h>
#include <sys/resource.h>

#include <thread>

#include "server/http_connection.h"
#include "servetune/error.h"

namespace servetune::server {
namespace detail {

void ServerCore::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](const error_code& ec, tcp::socket socket) { on_accept(ec, std::move(socket)); });
}

void ServerCore::on_accept(const error_code& ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {
    // Out of file descriptors and the like: back off instead of spinning.
    accept_retry.expires_after(kAcceptRetryDelay);
    accept_retry.async_wait([this](const error_code& e) {
      if (!e && acceptor.is_open()) accept();
    });
    return;
  }
  metrics.connections_total.fetch_add(1, std::memory_order_relaxed);
  if (metrics.connections_open.load(std::memory_order_relaxed) >= options.max_connections) {
    metrics.connections_refused.fetch_add(1, std::memory_order_relaxed);
    error_code ignored;
    socket.close(ignored);
    return accept();
  }
  error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  auto c = std::make_shared<Connection>(std::move(socket), *this);
  {
    std::lock_guard lock(registry_mutex);
    connections.emplace(c.get(), c);
  }
  net::dispatch(c->executor(), [c] { c->start(); });
  accept();
}

void ServerCore::remove(Connection* c) {
  bool last = false;
  {
    std::lock_guard lock(registry_mutex);
    connections.erase(c);
    last = connections.empty();
  }
  if (last && shutting_down.load() && !destroying.load()) ioc.stop();
}

template <typename Fn>
void ServerCore::for_each_connection(Fn fn) {
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard lock(registry_mutex);
    for (auto& [p, w] : connections) {
      if (auto c = w.lock()) all.push_back(std::move(c));
    }
  }
  for (auto& c : all) net::post(c->executor(), [c, fn] { fn(*c); });
}

void ServerCore::begin_shutdown() {
  if (shutting_down.exchange(true)) {
    std::fprintf(stderr, "servetune serve: aborting requests in flight\n");
    app.abort_all();
    return;
  }
  std::fprintf(stderr, "servetune serve: shutting down (requests in flight may finish within %.1f s)\n",
               static_cast<double>(options.shutdown_timeout.count()) / 1000.0);
  error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  bool none = false;
  {
    std::lock_guard lock(registry_mutex);
    none = connections.empty();
  }
  if (none) {
    ioc.stop();
    return;
  }
  for_each_connection([](Connection& c) { c.drain(); });
  shutdown_timer.expires_after(options.shutdown_timeout);
  shutdown_timer.async_wait([this](const error_code& ec) {
    if (ec) return;
    std::fprintf(stderr, "servetune serve: shutdown timeout; aborting requests in flight\n");
    app.abort_all();
    shutdown_timer.expires_after(kForceCloseDelay);
    shutdown_timer.async_wait([this](const error_code& e) {
      if (e) return;
      for_each_connection([](Connection& c) { c.force_close(); });
      ioc.stop();
    });
  });
}

void ServerCore::wait_signal() {
  signals->async_wait([this](const error_code& ec, int) {
    if (ec) return;
    begin_shutdown();
    wait_signal();  // a second signal aborts what is still running
  });
}

void ServerCore::run_loop() {
  auto loop = [this] {
    for (;;) {
      try {
        ioc.run();
        return;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "servetune serve: internal error in the I/O loop: %s\n", e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < options.io_threads; ++i) threads.emplace_back(loop);
  loop();
  for (auto& t : threads) t.join();
  std::lock_guard lock(guard->mutex);
  guard->alive = false;
}

}  // namespace detail

namespace {

void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

using detail::error_code;
using detail::ServerCore;
using detail::tcp;
namespace net = boost::asio;

class HttpServer::Impl {
 public:
  Impl(const HttpOptions& options, HttpApp& app, ServerMetrics& metrics) : core(options, app, metrics) {}
  ServerCore core;
};

HttpServer::HttpServer(const HttpOptions& options, HttpApp& app, ServerMetrics& metrics)
    : impl_(std::make_unique<Impl>(options, app, metrics)) {
  if (options.io_threads < 1) throw_usage("--io-threads must be at least 1");
  raise_fd_limit();
  ::signal(SIGPIPE, SIG_IGN);
  ServerCore& c = impl_->core;
  const std::string where = options.host + ":" + std::to_string(options.port);
  error_code ec;
  const auto address = net::ip::make_address(options.host, ec);
  if (ec) throw Error(ErrorKind::kUsage, "--host '" + options.host + "' is not an IP address");
  const tcp::endpoint endpoint(address, options.port);
  c.acceptor.open(endpoint.protocol(), ec);
  if (!ec) c.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) c.acceptor.bind(endpoint, ec);
  if (!ec) c.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw_io(where, "cannot listen: " + ec.message());
  if (options.handle_signals) {
    c.signals.emplace(c.ioc, SIGINT, SIGTERM);
  }
}

HttpServer::~HttpServer() {
  std::lock_guard lock(impl_->core.guard->mutex);
  impl_->core.guard->alive = false;
}

uint16_t HttpServer::port() const { return impl_->core.acceptor.local_endpoint().port(); }

void HttpServer::run() {
  ServerCore& c = impl_->core;
  c.accept();
  if (c.signals) c.wait_signal();
  c.run_loop();
}

void HttpServer::shutdown() {
  ServerCore& c = impl_->core;
  net::post(c.ioc, [&c] { c.begin_shutdown(); });
}

bool HttpServer::shutting_down() const { return impl_->core.shutting_down.load(); }

}  // namespace servetune::server