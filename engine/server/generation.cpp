// GenerationTask: the bridge between one RequestStream and one HTTP exchange (see generation.h).
#include "server/generation.h"

#include <atomic>
#include <chrono>
#include <random>

#include "server/api_error.h"
#include "server/openai_response.h"
#include "server/prometheus.h"
#include "servetune/engine.h"
#include "servetune/error.h"

namespace servetune::server {

void InFlight::add(uint64_t id) {
  std::lock_guard lock(mutex_);
  ids_.insert(id);
}

void InFlight::remove(uint64_t id) {
  std::lock_guard lock(mutex_);
  ids_.erase(id);
}

std::vector<uint64_t> InFlight::ids() const {
  std::lock_guard lock(mutex_);
  return {ids_.begin(), ids_.end()};
}

std::string new_request_id(ApiKind kind) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull));
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(rng()), static_cast<unsigned long long>(rng()));
  return std::string(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + hex;
}

namespace {

double seconds(EngineClock::duration d) { return std::chrono::duration<double>(d).count(); }

// Coalesces wake-ups: the engine thread posts at most one pump at a time per request.
struct Wake {
  std::atomic<bool> pending{false};
};

class GenerationTask : public std::enable_shared_from_this<GenerationTask> {
 public:
  GenerationTask(GenerationContext& ctx, const GenerateRequest& request, const std::string& model_name,
                 EngineClock::time_point arrival, std::shared_ptr<Exchange> exchange)
      : ctx_(ctx),
        streaming_(request.stream),
        arrival_(arrival),
        exchange_(std::move(exchange)),
        builder_(request, new_request_id(request.kind), std::chrono::duration_cast<std::chrono::seconds>(
                                                            std::chrono::system_clock::now().time_since_epoch()).count(),
                 model_name, ctx.engine.tokenizer()) {}

  ~GenerationTask() { settle(FinishReason::kAbort, true); }

  void start(Request engine_request) {
    try {
      stream_ = ctx_.engine.submit(std::move(engine_request));
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kUsage) throw ApiError(503, std::string("the server is shutting down: ") + e.what());
      throw api_error_from(e);
    }
    id_ = stream_->id();
    submitted_ = true;
    ctx_.in_flight.add(id_);
    ctx_.metrics.in_flight.fetch_add(1, std::memory_order_relaxed);

    std::weak_ptr<GenerationTask> weak = weak_from_this();
    auto wake = wake_;
    std::shared_ptr<Exchange> exchange = exchange_;
    stream_->set_notifier([wake, weak, exchange] {
      if (wake->pending.exchange(true)) return;
      exchange->post([wake, weak] {
        wake->pending.store(false);
        if (auto t = weak.lock()) t->pump();
      });
    });
    exchange_->on_disconnect([self = shared_from_this()] { self->settle(FinishReason::kAbort, true); });
    if (streaming_) {
      exchange_->begin_stream();
      exchange_->stream(builder_.stream_start());
    }
    pump();  // events pushed before the notifier was set
  }

 private:
  void pump() {
    if (done_) return;
    std::string out;
    for (TokenEvent& e : stream_->drain()) {
      observe(e);
      if (streaming_) {
        if (e.finish == FinishReason::kError) {
          out += ResponseBuilder::stream_error("generation failed: " + e.error, 500);
        } else {
          out += builder_.stream_event(e);
        }
      } else {
        builder_.add(e);
      }
      if (e.finish != FinishReason::kNone) {
        finish(e, out);
        return;
      }
    }
    if (!out.empty()) exchange_->stream(std::move(out));
  }

  void finish(const TokenEvent& e, std::string& out) {
    settle(e.finish, false);
    ctx_.metrics.e2e.observe(seconds(e.time - arrival_));
    if (tokens_ > 1) ctx_.metrics.tpot.observe(seconds(last_token_ - first_token_) / static_cast<double>(tokens_ - 1));
    if (streaming_) {
      out += kSseDone;
      exchange_->stream(std::move(out));
      exchange_->end_stream();
      return;
    }
    HttpResponse r;
    if (e.finish == FinishReason::kError) {
      r.status = 500;
      r.body = ApiError(500, "generation failed: " + e.error).body();
    } else if (e.finish == FinishReason::kAbort) {
      r.status = 503;
      r.body = ApiError(503, "the request was aborted: the server is shutting down").body();
    } else {
      r.body = builder_.response(e);
    }
    exchange_->reply(std::move(r));
  }

  void observe(const TokenEvent& e) {
    if (e.token_ids.empty()) return;
    if (e.first_token) {
      ctx_.metrics.ttft.observe(seconds(e.time - arrival_));
      first_token_ = e.time;
    } else if (tokens_ > 0) {
      ctx_.metrics.itl.observe(seconds(e.time - last_token_));
    }
    last_token_ = e.time;
    tokens_ += static_cast<int64_t>(e.token_ids.size());
  }

  // Once per request: metrics and bookkeeping; aborts the engine request when it has not finished.
  void settle(FinishReason reason, bool abort) {
    if (done_ || !submitted_) return;
    done_ = true;
    if (abort) ctx_.engine.abort(id_);
    ctx_.in_flight.remove(id_);
    ctx_.metrics.in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (reason != FinishReason::kError) ctx_.metrics.count_finish(reason);
  }

  GenerationContext& ctx_;
  const bool streaming_;
  const EngineClock::time_point arrival_;
  std::shared_ptr<Exchange> exchange_;
  ResponseBuilder builder_;
  std::shared_ptr<Wake> wake_ = std::make_shared<Wake>();
  std::shared_ptr<RequestStream> stream_;
  uint64_t id_ = 0;
  bool submitted_ = false;
  bool done_ = false;
  int64_t tokens_ = 0;
  EngineClock::time_point first_token_{}, last_token_{};
};

}  // namespace

void start_generation(GenerationContext& ctx, GenerateRequest request, std::vector<int32_t> prompt_ids,
                      const std::string& model_name, EngineClock::time_point arrival, std::shared_ptr<Exchange> exchange) {
  Request r;
  r.prompt_ids = std::move(prompt_ids);
  r.sampling = request.sampling;
  auto task = std::make_shared<GenerationTask>(ctx, request, model_name, arrival, std::move(exchange));
  task->start(std::move(r));
}

}  // namespace servetune::server
