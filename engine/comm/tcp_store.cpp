// TcpStore: a thread-per-connection server holding a map guarded by one mutex; requests are
// [op u8][key len u32][key][value len u32][value]; replies are [status u8][value len u32][value]
// (status 0: ok, 1: the key did not appear within the request's timeout).
#include "comm/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"

namespace servetune {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void throw_store(const std::string& what) { throw Error(ErrorKind::kIo, "tcp store: " + what); }

// Sends all bytes; false when the peer is gone.
bool send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Receives exactly n bytes before `deadline` (none: wait forever); false on close, error or timeout.
bool recv_all(int fd, void* data, size_t n, std::optional<Clock::time_point> deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd pfd{fd, POLLIN, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
    }
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool send_blob(int fd, const std::string& s) {
  const auto n = static_cast<uint32_t>(s.size());
  return send_all(fd, &n, 4) && send_all(fd, s.data(), s.size());
}

bool recv_blob(int fd, std::string& s, std::optional<Clock::time_point> deadline) {
  uint32_t n = 0;
  if (!recv_all(fd, &n, 4, deadline)) return false;
  if (n > (64u << 20)) return false;
  s.resize(n);
  return recv_all(fd, s.data(), n, deadline);
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) throw_store("cannot resolve '" + host + "': " + gai_strerror(rc));
  return res;
}

}  // namespace

std::pair<std::string, int> parse_host_port(const std::string& address, const std::string& what) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw_usage(what + " must be HOST:PORT, got '" + address + "'");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) throw_usage(what + " has a bad port in '" + address + "'");
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65535) throw_usage(what + " has a bad port in '" + address + "' (1..65535)");
  return {host, port};
}

class TcpStore::Server {
 public:
  Server(const std::string& host, int port) {
    addrinfo* res = resolve(host, port, true);
    std::string last_error = "no address";
    for (addrinfo* a = res; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
        listen_fd_ = fd;
      } else {
        last_error = std::strerror(errno);
        ::close(fd);
      }
    }
    ::freeaddrinfo(res);
    if (listen_fd_ < 0) throw_store("cannot listen on " + host + ":" + std::to_string(port) + ": " + last_error);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~Server() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
      cv_.notify_all();
    }
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(listen_fd_);
    for (auto& t : handlers_) t.join();
    for (int fd : client_fds_) ::close(fd);
  }

  int port() const { return port_; }

  void set(const std::string& key, std::string value) {
    std::lock_guard lock(mutex_);
    map_[key] = std::move(value);
    cv_.notify_all();
  }

  // The value of `key` once it exists; nullopt after `timeout` or when stopping.
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return stopping_ || map_.count(key) > 0; });
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }

 private:
  void accept_loop() {
    for (;;) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      std::lock_guard lock(mutex_);
      if (stopping_) {
        if (fd >= 0) ::close(fd);
        return;
      }
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      client_fds_.push_back(fd);
      handlers_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    for (;;) {
      char op = 0;
      std::string key, value;
      if (!recv_all(fd, &op, 1, std::nullopt) || !recv_blob(fd, key, std::nullopt) || !recv_blob(fd, value, std::nullopt)) return;
      char status = 0;
      std::string reply;
      if (op == 'S') {
        set(key, std::move(value));
      } else {
        // For a get, the value field carries the timeout in milliseconds.
        int64_t ms = 0;
        for (char c : value) ms = (c >= '0' && c <= '9' && ms < (int64_t{1} << 40)) ? ms * 10 + (c - '0') : ms;
        auto got = get(key, std::chrono::milliseconds(ms));
        if (got) reply = std::move(*got);
        else status = 1;
      }
      if (!send_all(fd, &status, 1) || !send_blob(fd, reply)) return;
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::string> map_;
  std::vector<int> client_fds_;
  std::vector<std::thread> handlers_;
};

TcpStore::TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout)
    : host_(host), timeout_(timeout) {
  if (is_server) {
    server_ = std::make_unique<Server>(host, port);
    port_ = server_->port();
    return;
  }
  port_ = port;
  const auto deadline = Clock::now() + timeout;
  std::string last_error;
  while (fd_ < 0) {
    addrinfo* res = resolve(host, port, false);
    for (addrinfo* a = res; a != nullptr && fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd_ = fd;
      } else {
        last_error = std::strerror(errno);
        ::close(fd);
      }
    }
    ::freeaddrinfo(res);
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline) {
      throw_store("cannot connect to " + host + ":" + std::to_string(port) + " within " + std::to_string(timeout.count()) +
                  " ms (" + last_error + "); is rank 0 running?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

int TcpStore::port() const { return port_; }

std::vector<char> TcpStore::request(char op, const std::string& key, const std::vector<char>& value,
                                    std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  const std::string payload(value.begin(), value.end());
  if (!send_all(fd_, &op, 1) || !send_blob(fd_, key) || !send_blob(fd_, payload)) {
    throw_store("lost the connection to " + host_ + ":" + std::to_string(port_));
  }
  // The server answers a get by its own timeout; allow a margin for the network.
  const auto deadline = Clock::now() + timeout + std::chrono::seconds(5);
  char status = 0;
  std::string reply;
  if (!recv_all(fd_, &status, 1, deadline) || !recv_blob(fd_, reply, deadline)) {
    throw_store("no answer from " + host_ + ":" + std::to_string(port_) + " (rank 0 gone?)");
  }
  if (status != 0) throw_store("key '" + key + "' did not appear within " + std::to_string(timeout.count()) + " ms");
  return {reply.begin(), reply.end()};
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  if (server_) {
    server_->set(key, std::string(value.begin(), value.end()));
    return;
  }
  request('S', key, value, timeout_);
}

std::vector<char> TcpStore::get(const std::string& key) {
  if (server_) {
    auto got = server_->get(key, timeout_);
    if (!got) throw_store("key '" + key + "' did not appear within " + std::to_string(timeout_.count()) + " ms");
    return {got->begin(), got->end()};
  }
  const std::string ms = std::to_string(timeout_.count());
  return request('G', key, std::vector<char>(ms.begin(), ms.end()), timeout_);
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& key : keys) {
    const auto left = std::max<std::chrono::milliseconds>(
        std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    if (server_) {
      if (!server_->get(key, left)) throw_store("key '" + key + "' did not appear within " + std::to_string(timeout.count()) + " ms");
    } else {
      const std::string ms = std::to_string(left.count());
      request('G', key, std::vector<char>(ms.begin(), ms.end()), left);
    }
  }
}

}  // namespace servetune
