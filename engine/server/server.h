// `servetune serve`: the OpenAI-compatible HTTP server on the built-in engine. Routes: POST /v1/completions,
// /v1/chat/completions, /tokenize, /detokenize; GET /v1/models, /health, /metrics. Usage: construct (binds),
// run() until SIGINT/SIGTERM or shutdown(), then destroy the server before the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/http_server.h"

namespace servetune {
class Engine;
}

namespace servetune::server {

struct ServerOptions {
  HttpOptions http;
  std::string api_key;                       // "" = no authentication
  std::vector<std::string> served_model_names;  // names clients may ask for; the first is listed by /v1/models
  int64_t max_queued_requests = 4096;        // requests allowed beyond the engine's running slots; more get 503
  int worker_threads = 2;                    // parse, template and tokenize request bodies off the I/O threads
};

class Server {
 public:
  // Binds the listening socket; throws Error (kIo: cannot listen, kUsage: bad option).
  Server(Engine& engine, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  void run();       // serves until shutdown completes
  void shutdown();  // thread-safe; same as SIGTERM

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace servetune::server
