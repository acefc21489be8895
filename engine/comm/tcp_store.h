// A minimal key-value rendezvous store over TCP: rank 0 serves it at host:port, every rank (rank 0 included)
// sets and gets keys. get() waits for the key up to the store's timeout. Used to exchange gloo addresses and the
// NCCL unique id (the way SGLang bootstraps several nodes from --dist-init-addr).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace servetune {

// "host:port" -> {host, port}; throws Error(kUsage) naming `what` when malformed.
std::pair<std::string, int> parse_host_port(const std::string& address, const std::string& what);

class TcpStore {
 public:
  // The server listens on host:port (port 0: a free port, see port()); clients connect to it, retrying until
  // `timeout` passes. Throws Error(kIo) when it cannot listen or connect.
  TcpStore(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  int port() const;
  void set(const std::string& key, const std::vector<char>& value);
  // Waits for `key` up to the store's timeout; throws Error(kIo) on timeout or a lost connection.
  std::vector<char> get(const std::string& key);
  // Waits until every key exists, up to `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

 private:
  class Server;
  std::unique_ptr<Server> server_;
  int fd_ = -1;  // client connection (clients only)
  std::mutex mutex_;  // one request at a time on fd_
  int port_ = 0;
  std::string host_;
  std::chrono::milliseconds timeout_;
  std::vector<char> request(char op, const std::string& key, const std::vector<char>& value, std::chrono::milliseconds timeout);
};

}  // namespace servetune
