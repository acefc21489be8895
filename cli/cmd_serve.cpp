// `servetune serve`: runs the built-in engine behind an OpenAI-compatible HTTP server until SIGINT/SIGTERM,
// then shuts down gracefully (stop accepting, let requests finish within --shutdown-timeout, abort the rest).
// With --node-rank > 0 it runs a tensor-parallel worker process instead, until node 0 shuts the group down.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "commands.h"
#include "engine_flags.h"
#include "server/server.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tensor_parallel_worker.h"

namespace servetune::cli {
namespace {

struct ServeOptions {
  EngineConfig engine;
  server::ServerOptions server;
  int port = 8000;
  double keep_alive_s = 30.0;
  double shutdown_timeout_s = 30.0;
};

std::chrono::milliseconds to_ms(double seconds, const char* flag) {
  if (!(seconds > 0.0) || seconds > 1e6) throw_usage(std::string(flag) + " must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

void run_serve(ServeOptions& o) {
  if (o.port < 0 || o.port > 65535) throw_usage("--port must be in [0, 65535]");
  if (o.server.api_key.empty()) {
    if (const char* key = std::getenv("SERVETUNE_API_KEY")) o.server.api_key = key;
  }
  auto& http = o.server.http;
  http.port = static_cast<uint16_t>(o.port);
  http.keep_alive_timeout = to_ms(o.keep_alive_s, "--timeout-keep-alive");
  http.shutdown_timeout = to_ms(o.shutdown_timeout_s, "--shutdown-timeout");
  if (http.max_connections < 1) throw_usage("--max-connections must be at least 1");
  if (http.max_body_bytes < 1024) throw_usage("--max-request-body-bytes must be at least 1024");

  if (o.engine.node_rank > 0) {
    // SGLang's layout: the other nodes run the same command with their --node-rank and serve no HTTP.
    std::fprintf(stderr, "servetune serve: tensor-parallel worker, node %d of %d, joining rank 0 at %s\n", o.engine.node_rank,
                 o.engine.nnodes, o.engine.dist_init_addr.c_str());
    std::fflush(stderr);
    run_tensor_parallel_worker(o.engine);
    std::fprintf(stderr, "servetune serve: stopped (rank 0 shut the group down)\n");
    return;
  }
  Engine engine(o.engine);
  {
    server::Server srv(engine, o.server);
    const EngineStats stats = engine.stats();
    std::fprintf(stderr, "servetune serve: listening on http://%s:%u (model %s, KV cache %lld tokens, %d I/O thread%s)\n",
                 http.host.c_str(), static_cast<unsigned>(srv.port()), o.engine.model.c_str(),
                 static_cast<long long>(stats.kv_blocks_total * stats.page_size), http.io_threads,
                 http.io_threads == 1 ? "" : "s");
    std::fflush(stderr);
    srv.run();
  }
  engine.shutdown();
  std::fprintf(stderr, "servetune serve: stopped\n");
}

void add_serve_command(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server on the built-in engine");
  add_engine_flags(cmd, opts->engine);
  auto& s = opts->server;
  const char* g = "Server";
  cmd->add_option("--host", s.http.host, "Address to listen on (an IP address)")->capture_default_str()->group(g);
  cmd->add_option("--port", opts->port, "TCP port (0: any free port, printed at start)")->capture_default_str()->group(g);
  cmd->add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize (or set SERVETUNE_API_KEY)")
      ->group(g);
  cmd->add_option("--served-model-name", s.served_model_names, "Model name(s) clients use (default: the model file name)")
      ->group(g);
  cmd->add_option("--max-queued-requests", s.max_queued_requests,
                  "Requests allowed to wait beyond --max-running-requests; more get 503 with Retry-After")
      ->capture_default_str()->group(g);
  cmd->add_option("--io-threads", s.http.io_threads, "Threads serving all HTTP connections")->capture_default_str()->group(g);
  cmd->add_option("--worker-threads", s.worker_threads,
                  "Threads that parse, template and tokenize request bodies (off the I/O threads)")
      ->capture_default_str()->group(g);
  cmd->add_option("--max-connections", s.http.max_connections, "Open connections beyond this are closed at accept")
      ->capture_default_str()->group(g);
  cmd->add_option("--max-request-body-bytes", s.http.max_body_bytes, "Larger request bodies get 413")->capture_default_str()->group(g);
  cmd->add_option("--max-header-bytes", s.http.max_header_bytes, "Larger request headers get 431")->capture_default_str()->group(g);
  cmd->add_option("--timeout-keep-alive", opts->keep_alive_s,
                  "Seconds an idle connection may wait for its next request (above clients' pool expiry: httpx 5, aiohttp 15)")
      ->capture_default_str()->group(g);
  cmd->add_option("--shutdown-timeout", opts->shutdown_timeout_s,
                  "Seconds requests in flight may take to finish after SIGINT/SIGTERM before they are aborted")
      ->capture_default_str()->group(g);
  cmd->callback([opts] { run_serve(*opts); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(30, add_serve_command);

}  // namespace servetune::cli
