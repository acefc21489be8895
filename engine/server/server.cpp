// The OpenAI-compatible application on top of HttpServer: authentication, routing, model-name checks, prompt
// rendering and tokenization, context and queue limits, and the non-generation routes (/v1/models, /health,
// /metrics, /tokenize, /detokenize). Generation itself lives in generation.cpp. Routes that read a body (parse it,
// render a chat template, tokenize) run on a worker pool, so an I/O thread never waits on one request's prompt.
#include "server/server.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/json_text.h"
#include "server/openai_request.h"
#include "server/prometheus.h"
#include "server/worker_pool.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/model_info.h"
#include "servetune/tokenizer.h"

namespace servetune::server {
namespace {

HttpResponse json_response(std::string body, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(e.body(), e.status());
  if (e.status() == 503) r.headers.emplace_back("Retry-After", "1");
  if (e.status() == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

std::string default_model_name(const std::string& model_path) {
  std::filesystem::path p(model_path);
  if (p.has_filename() && p.filename() != "." && p.filename() != "..") return p.filename().string();
  return model_path;
}

bool needs_auth(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/v1" || path == "/tokenize" || path == "/detokenize" || path == "/flush_cache" ||
         path == "/reset_prefix_cache";
}

// The reply for the exception being handled: an ApiError as it is, an engine Error mapped to its status, anything
// else a 500 (logged: it is a bug of ours, not the client's).
HttpResponse current_error_response() {
  try {
    throw;
  } catch (const ApiError& e) {
    return error_response(e);
  } catch (const Error& e) {
    return error_response(api_error_from(e));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "servetune serve: internal error handling a request: %s\n", e.what());
    return error_response(ApiError(500, std::string("internal error: ") + e.what()));
  } catch (...) {
    std::fprintf(stderr, "servetune serve: internal error handling a request\n");
    return error_response(ApiError(500, "internal error"));
  }
}

}  // namespace

class Server::Impl : public HttpApp {
 public:
  Impl(Engine& engine, ServerOptions options)
      : engine_(engine),
        options_(std::move(options)),
        tokenizer_(engine.tokenizer()),
        gen_ctx_{engine, metrics_, in_flight_},
        created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()) {
    if (options_.served_model_names.empty()) options_.served_model_names.push_back(default_model_name(engine.config().model));
    for (const auto& name : options_.served_model_names) {
      if (name.empty()) throw_usage("--served-model-name must not be empty");
    }
    if (options_.max_queued_requests < 0) throw_usage("--max-queued-requests must be >= 0");
    if (options_.worker_threads < 1) throw_usage("--worker-threads must be at least 1");
    context_length_ = engine.config().context_length.value_or(engine.model_info().context_length);
    http_ = std::make_unique<HttpServer>(options_.http, *this, metrics_);
    workers_ = std::make_unique<WorkerPool>(options_.worker_threads);
  }

  void handle(HttpRequest req, std::shared_ptr<Exchange> ex) override {
    try {
      route(req, ex);
    } catch (const ApiError& e) {
      ex->reply(error_response(e));
    } catch (const Error& e) {
      ex->reply(error_response(api_error_from(e)));
    }
  }

  void abort_all() override {
    for (uint64_t id : in_flight_.ids()) engine_.abort(id);
  }

  HttpServer& http() { return *http_; }
  const std::string& primary_name() const { return options_.served_model_names.front(); }

 private:
  // Counts a request in ServerMetrics::preparing while it is alive (queued or running on the worker pool, then on its
  // way back to its connection): shared by the closures that carry it, so it ends however they end, run or dropped.
  // A member type, not a file-local one: the closures that hold it belong to this class (GCC's -Wsubobject-linkage).
  class Preparing {
   public:
    explicit Preparing(ServerMetrics& m) : m_(m) { m_.preparing.fetch_add(1, std::memory_order_relaxed); }
    ~Preparing() { m_.preparing.fetch_sub(1, std::memory_order_relaxed); }
    Preparing(const Preparing&) = delete;
    Preparing& operator=(const Preparing&) = delete;

   private:
    ServerMetrics& m_;
  };

  void route(HttpRequest& req, const std::shared_ptr<Exchange>& ex) {
    const std::string& path = req.path;
    if (!options_.api_key.empty() && needs_auth(path) && !bearer_matches(req.authorization, options_.api_key)) {
      throw ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'", "", "invalid_api_key");
    }
    auto method_is = [&](const char* m) {
      if (req.method == m) return true;
      HttpResponse r = json_response(ApiError(405, "method " + req.method + " is not allowed on " + path).body(), 405);
      r.headers.emplace_back("Allow", m);
      ex->reply(std::move(r));
      return false;
    };
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      if (!method_is("POST")) return;
      check_capacity(1);
      const ApiKind kind = path == "/v1/chat/completions" ? ApiKind::kChat : ApiKind::kCompletion;
      offload(ex, [this, kind, body = std::move(req.body), arrival = req.arrival, ex] { return generate(kind, body, arrival, ex); });
    } else if (path == "/health") {
      if (method_is("GET")) ex->reply(health());
    } else if (path == "/metrics") {
      if (method_is("GET")) ex->reply(metrics());
    } else if (path == "/v1/models") {
      if (method_is("GET")) ex->reply(json_response(models().dump()));
    } else if (path.rfind("/v1/models/", 0) == 0) {
      if (method_is("GET")) ex->reply(model(path.substr(std::string("/v1/models/").size())));
    } else if (path == "/tokenize" || path == "/detokenize") {
      if (!method_is("POST")) return;
      const bool encode = path == "/tokenize";
      offload(ex, [this, encode, body = std::move(req.body), ex] {
        auto r = std::make_shared<HttpResponse>(encode ? tokenize(body) : detokenize(body));
        return std::function<void()>([r, ex] { ex->reply(std::move(*r)); });
      });
    } else if (path == "/flush_cache" || path == "/reset_prefix_cache") {
      // SGLang's and vLLM's names: forget the prefix cache (benchmarks call it between runs). SGLang takes GET too.
      if (!(path == "/flush_cache" && req.method == "GET") && !method_is("POST")) return;
      offload(ex, [this, ex] {
        nlohmann::json j;
        j["flushed_blocks"] = engine_.flush_prefix_cache();
        auto r = std::make_shared<HttpResponse>(json_response(j.dump()));
        return std::function<void()>([r, ex] { ex->reply(std::move(*r)); });
      });
    } else {
      throw ApiError(404, "no route " + req.method + " " + path, "", "not_found");
    }
  }

  // The served name the request asked for ("" means the default); 404 for any other model.
  const std::string& check_model(const std::string& requested) const {
    if (requested.empty()) return primary_name();
    for (const auto& name : options_.served_model_names) {
      if (name == requested) return name;
    }
    throw ApiError(404, "The model `" + requested + "` does not exist.", "model", "model_not_found");
  }

  // Runs `prepare` on the worker pool, then what it returns on the connection's executor; an error thrown by
  // either becomes the reply.
  void offload(const std::shared_ptr<Exchange>& ex, std::function<std::function<void()>()> prepare) {
    auto mark = std::make_shared<Preparing>(metrics_);
    workers_->post([ex, prepare = std::move(prepare), mark] {
      std::function<void()> finish;
      try {
        finish = prepare();
      } catch (...) {
        finish = [ex, r = std::make_shared<HttpResponse>(current_error_response())] { ex->reply(std::move(*r)); };
      }
      ex->post([ex, finish = std::move(finish), mark] {
        try {
          finish();
        } catch (...) {
          ex->reply(current_error_response());
        }
      });
    });
  }

  // Engine requests the server takes at once: the running slots plus the queue.
  int64_t capacity() const { return static_cast<int64_t>(engine_.config().max_running_requests) + options_.max_queued_requests; }

  // 503 when `n` more engine requests would exceed the capacity; requests still being prepared count as one each.
  void check_capacity(int64_t n) const {
    const int64_t limit = capacity();
    if (metrics_.in_flight.load(std::memory_order_relaxed) + metrics_.preparing.load(std::memory_order_relaxed) + n > limit) {
      throw ApiError(503, "the server is at capacity (" + std::to_string(limit) + " requests in flight); retry later", "",
                     "queue_full");
    }
  }

  // On a worker: parse, template, tokenize and check limits; returns the submission, which runs on the connection's
  // executor (where the generation task lives).
  std::function<void()> generate(ApiKind kind, const std::string& body, EngineClock::time_point arrival,
                                 const std::shared_ptr<Exchange>& ex) {
    auto r = std::make_shared<GenerateRequest>(kind == ApiKind::kChat ? parse_chat_request(body) : parse_completion_request(body));
    const std::string& model_name = check_model(r->model);
    if (http_->shutting_down()) throw ApiError(503, "the server is shutting down");
    if (r->n > capacity()) {
      throw_bad_request("'n' (" + std::to_string(r->n) + ") exceeds the " + std::to_string(capacity()) +
                            " requests this server takes at once",
                        "n");
    }
    auto ids = std::make_shared<std::vector<int32_t>>(prompt_ids(*r));
    apply_length_limits(*r, static_cast<int64_t>(ids->size()));
    return [this, r, ids, &model_name, arrival, ex] {
      if (!ex->connected()) return;  // the client left while its prompt was prepared
      check_capacity(r->n - 1);      // this request's own mark still counts one
      start_generation(gen_ctx_, std::move(*r), std::move(*ids), model_name, arrival, ex);
    };
  }

  std::vector<int32_t> prompt_ids(const GenerateRequest& r) const {
    const char* param = r.kind == ApiKind::kChat ? "messages" : "prompt";
    std::vector<int32_t> ids;
    if (r.kind == ApiKind::kChat) {
      ids = tokenizer_.encode(render_chat(r.messages, r.add_generation_prompt), r.add_special_tokens, /*parse_special=*/true);
    } else if (r.prompt_text) {
      ids = tokenizer_.encode(*r.prompt_text, r.add_special_tokens, /*parse_special=*/true);
    } else {
      ids = r.prompt_ids;
      const int64_t vocab = engine_.model_info().vocab;
      for (int32_t id : ids) {
        if (id >= vocab) throw_bad_request("prompt token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                               std::to_string(vocab - 1) + ")", param);
      }
    }
    if (ids.empty()) throw_bad_request("the prompt is empty", param);
    return ids;
  }

  std::string render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    try {
      return apply_chat_template(tokenizer_, messages, add_generation_prompt);
    } catch (const Error& e) {
      throw ApiError(400, std::string("cannot apply the model's chat template: ") + e.what(), "messages");
    }
  }

  // max_tokens defaults to the rest of the context (chat) and must fit the context and the KV cache.
  void apply_length_limits(GenerateRequest& r, int64_t prompt_len) const {
    const char* what = r.kind == ApiKind::kChat ? "messages" : "prompt";
    const int64_t limit = std::min<int64_t>(context_length_, engine_.kv_capacity_tokens());
    if (prompt_len >= limit) {
      throw ApiError(400, "This model's maximum context length is " + std::to_string(limit) + " tokens. However, your " + what +
                              " has " + std::to_string(prompt_len) + " tokens, leaving no room for the completion.",
                     what, "context_length_exceeded");
    }
    if (!r.max_tokens_given && r.kind == ApiKind::kChat) r.sampling.max_tokens = static_cast<int32_t>(limit - prompt_len);
    if (prompt_len + r.sampling.max_tokens > limit) {
      throw ApiError(400, "This model's maximum context length is " + std::to_string(limit) + " tokens. However, you requested " +
                              std::to_string(prompt_len + r.sampling.max_tokens) + " tokens (" + std::to_string(prompt_len) +
                              " in the " + what + ", " + std::to_string(r.sampling.max_tokens) +
                              " in the completion). Please reduce the length of the " + what + " or completion.",
                     "max_tokens", "context_length_exceeded");
    }
    if (r.sampling.min_tokens > r.sampling.max_tokens) {
      throw_bad_request("min_tokens (" + std::to_string(r.sampling.min_tokens) + ") must not exceed max_tokens (" +
                            std::to_string(r.sampling.max_tokens) + ")",
                        "min_tokens");
    }
  }

  HttpResponse health() const {
    if (http_->shutting_down()) return error_response(ApiError(503, "the server is shutting down"));
    HttpResponse r;
    r.content_type.clear();
    return r;
  }

  HttpResponse metrics() const {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = render_metrics(metrics_, engine_.stats(), primary_name(),
                            engine_.config().speculative_algorithm != SpeculativeAlgorithm::kNone);
    return r;
  }

  nlohmann::json model_card(const std::string& name) const {
    return {{"id", name},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "servetune"},
            {"root", engine_.config().model},
            {"parent", nullptr},
            {"max_model_len", context_length_}};
  }

  nlohmann::json models() const {
    nlohmann::json data = nlohmann::json::array();
    for (const auto& name : options_.served_model_names) data.push_back(model_card(name));
    return {{"object", "list"}, {"data", data}};
  }

  HttpResponse model(const std::string& name) const {
    for (const auto& n : options_.served_model_names) {
      if (n == name) return json_response(model_card(n).dump());
    }
    throw ApiError(404, "The model `" + name + "` does not exist.", "model", "model_not_found");
  }

  HttpResponse tokenize(const std::string& body) const {
    const TokenizeRequest r = parse_tokenize_request(body);
    check_model(r.model);
    const std::string text = r.prompt ? *r.prompt : render_chat(r.messages, r.add_generation_prompt);
    const std::vector<int32_t> ids = tokenizer_.encode(text, r.add_special_tokens, /*parse_special=*/true);
    std::string out = "{\"count\":" + std::to_string(ids.size()) + ",\"max_model_len\":" + std::to_string(context_length_) +
                      ",\"tokens\":" + nlohmann::json(ids).dump() + ",\"token_strs\":";
    if (r.return_token_strs) {
      out += '[';
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ',';
        append_json_string(out, tokenizer_.token_to_piece(ids[i]));
      }
      out += ']';
    } else {
      out += "null";
    }
    out += '}';
    return json_response(std::move(out));
  }

  HttpResponse detokenize(const std::string& body) const {
    const DetokenizeRequest r = parse_detokenize_request(body);
    check_model(r.model);
    for (int32_t id : r.tokens) {
      if (id >= tokenizer_.vocab_size()) {
        throw_bad_request("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                              std::to_string(tokenizer_.vocab_size() - 1) + ")",
                          "tokens");
      }
    }
    std::string out = "{\"prompt\":";
    append_json_string(out, tokenizer_.decode(r.tokens, /*skip_special=*/false));
    out += '}';
    return json_response(std::move(out));
  }

  Engine& engine_;
  ServerOptions options_;
  const Tokenizer& tokenizer_;
  ServerMetrics metrics_;
  InFlight in_flight_;
  GenerationContext gen_ctx_;
  int64_t created_;
  int64_t context_length_ = 0;
  std::unique_ptr<HttpServer> http_;  // destroyed before the state its handlers use
  std::unique_ptr<WorkerPool> workers_;  // last: its jobs use everything above, http_ included
};

Server::Server(Engine& engine, ServerOptions options) : impl_(std::make_unique<Impl>(engine, std::move(options))) {}
Server::~Server() = default;
uint16_t Server::port() const { return impl_->http().port(); }
void Server::run() { impl_->http().run(); }
void Server::shutdown() { impl_->http().shutdown(); }

}  // namespace servetune::server
