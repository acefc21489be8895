// GenerationTask: the bridge between one HTTP exchange and its choices' RequestStreams (see generation.h).
#include "server/generation.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <random>

#include "server/api_error.h"
#include "server/openai_response.h"
#include "server/prometheus.h"
#include "server/prompt_logprobs.h"
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
                 model_name, ctx.engine.tokenizer()),
        choices_(static_cast<size_t>(std::max(request.n, 1))) {}

  // prompt_logprobs: choice 0's engine request returns the prompt's logits rows (start_generation), scored here as
  // they arrive so no more than one event's rows are held.
  void score_prompt(std::vector<int32_t> prompt, int32_t top_k) {
    prompt_logprobs_.emplace(std::move(prompt), top_k, ctx_.engine.model_info().vocab, ctx_.engine.tokenizer());
  }

  ~GenerationTask() { settle_all(); }

  // One engine request per choice; if the engine rejects one, those already submitted are aborted.
  void start(const std::vector<Request>& engine_requests) {
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      try {
        c.stream = ctx_.engine.submit(engine_requests[i]);
      } catch (const Error& e) {
        settle_all();
        if (e.kind() == ErrorKind::kUsage) throw ApiError(503, std::string("the server is shutting down: ") + e.what());
        throw api_error_from(e);
      }
      c.id = c.stream->id();
      c.submitted = true;
      ctx_.in_flight.add(c.id);
      ctx_.metrics.in_flight.fetch_add(1, std::memory_order_relaxed);
    }

    std::weak_ptr<GenerationTask> weak = weak_from_this();
    auto wake = wake_;
    std::shared_ptr<Exchange> exchange = exchange_;
    for (Choice& c : choices_) {
      c.stream->set_notifier([wake, weak, exchange] {
        if (wake->pending.exchange(true)) return;
        exchange->post([wake, weak] {
          wake->pending.store(false);
          if (auto t = weak.lock()) t->pump();
        });
      });
    }
    exchange_->on_disconnect([self = shared_from_this()] {
      self->done_ = true;
      self->settle_all();
    });
    if (streaming_) {
      exchange_->begin_stream();
      exchange_->stream(builder_.stream_start());
    }
    pump();  // events pushed before the notifiers were set
  }

 private:
  struct Choice {
    std::shared_ptr<RequestStream> stream;
    uint64_t id = 0;
    bool submitted = false;
    bool settled = false;  // finished (or aborted) and counted
    FinishReason finish = FinishReason::kNone;
    Usage usage;
    int64_t tokens = 0;
    EngineClock::time_point first_token{}, last_token{};
  };

  // Choices in index order, each drained of what it has; the response ends once every choice has finished, or at
  // the first error (the other choices are aborted).
  void pump() {
    if (done_) return;
    std::string out;
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      if (c.settled) continue;
      for (TokenEvent& e : c.stream->drain()) {
        observe(c, e);
        if (prompt_logprobs_ && !e.prompt_logits.empty()) prompt_logprobs_->add_rows(e.prompt_logits);
        if (e.finish == FinishReason::kError) return fail(e, out);
        if (streaming_) {
          out += builder_.stream_event(static_cast<int>(i), e);
        } else {
          builder_.add(static_cast<int>(i), e);
        }
        if (e.finish != FinishReason::kNone) {
          finish_choice(c, e);
          break;
        }
      }
    }
    if (unfinished_ == 0) return finish(out);
    if (!out.empty()) exchange_->stream(std::move(out));
  }

  void finish_choice(Choice& c, const TokenEvent& e) {
    c.finish = e.finish;
    c.usage = e.usage;
    settle(c, e.finish, false);
    ctx_.metrics.e2e.observe(seconds(e.time - arrival_));
    if (c.tokens > 1) ctx_.metrics.tpot.observe(seconds(c.last_token - c.first_token) / static_cast<double>(c.tokens - 1));
  }

  void finish(std::string& out) {
    done_ = true;
    std::vector<Usage> usages;
    std::vector<FinishReason> reasons;
    bool aborted = false;
    for (const Choice& c : choices_) {
      usages.push_back(c.usage);
      reasons.push_back(c.finish);
      aborted = aborted || c.finish == FinishReason::kAbort;
    }
    const Usage total = combined_usage(usages);
    if (streaming_) {
      out += builder_.stream_usage(total);
      out += kSseDone;
      exchange_->stream(std::move(out));
      exchange_->end_stream();
      return;
    }
    HttpResponse r;
    if (aborted) {
      r.status = 503;
      r.body = ApiError(503, "the request was aborted: the server is shutting down").body();
    } else if (prompt_logprobs_ && !prompt_logprobs_->complete()) {
      r.status = 500;
      r.body = ApiError(500, "the engine's prompt logits rows do not match the prompt's positions").body();
    } else {
      const std::string prompt_json = prompt_logprobs_ ? prompt_logprobs_->json() : std::string();
      r.body = builder_.response(reasons, total, prompt_logprobs_ ? &prompt_json : nullptr);
    }
    exchange_->reply(std::move(r));
  }

  // An engine error in any choice ends the whole response.
  void fail(const TokenEvent& e, std::string& out) {
    settle_all();
    done_ = true;
    if (streaming_) {
      out += ResponseBuilder::stream_error("generation failed: " + e.error, 500);
      out += kSseDone;
      exchange_->stream(std::move(out));
      exchange_->end_stream();
      return;
    }
    HttpResponse r;
    r.status = 500;
    r.body = ApiError(500, "generation failed: " + e.error).body();
    exchange_->reply(std::move(r));
  }

  void observe(Choice& c, const TokenEvent& e) {
    if (e.token_ids.empty()) return;
    if (e.first_token) {
      ctx_.metrics.ttft.observe(seconds(e.time - arrival_));
      c.first_token = e.time;
    } else if (c.tokens > 0) {
      ctx_.metrics.itl.observe(seconds(e.time - c.last_token));
    }
    c.last_token = e.time;
    c.tokens += static_cast<int64_t>(e.token_ids.size());
  }

  // Once per choice: metrics and bookkeeping; aborts the engine request when it has not finished.
  void settle(Choice& c, FinishReason reason, bool abort) {
    if (c.settled || !c.submitted) return;
    c.settled = true;
    --unfinished_;
    if (abort) ctx_.engine.abort(c.id);
    ctx_.in_flight.remove(c.id);
    ctx_.metrics.in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (reason != FinishReason::kError) ctx_.metrics.count_finish(reason);
  }

  // The client went away, an error ended the response, or the task is dropped: abort what still runs.
  void settle_all() {
    for (Choice& c : choices_) settle(c, FinishReason::kAbort, true);
  }

  GenerationContext& ctx_;
  const bool streaming_;
  const EngineClock::time_point arrival_;
  std::shared_ptr<Exchange> exchange_;
  ResponseBuilder builder_;
  std::shared_ptr<Wake> wake_ = std::make_shared<Wake>();
  std::vector<Choice> choices_;
  std::optional<PromptLogprobs> prompt_logprobs_;
  size_t unfinished_ = choices_.size();
  bool done_ = false;
};

}  // namespace

void start_generation(GenerationContext& ctx, GenerateRequest request, std::vector<int32_t> prompt_ids,
                      const std::string& model_name, EngineClock::time_point arrival, std::shared_ptr<Exchange> exchange) {
  std::vector<Request> requests(static_cast<size_t>(std::max(request.n, 1)));
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    if (i + 1 < requests.size()) {
      r.prompt_ids = prompt_ids;
    } else {
      r.prompt_ids = std::move(prompt_ids);
    }
    r.sampling = request.sampling;
    // Choice i of a seeded request draws with seed + i, as vLLM's parallel sampling does: distinct, reproducible.
    if (request.sampling.seed) r.sampling.seed = *request.sampling.seed + i;
  }
  // The prompt's log-probabilities are the same for every choice: choice 0 alone computes them.
  if (request.prompt_logprobs >= 0) requests[0].prompt_logits = true;
  auto task = std::make_shared<GenerationTask>(ctx, request, model_name, arrival, std::move(exchange));
  if (request.prompt_logprobs >= 0) task->score_prompt(requests[0].prompt_ids, request.prompt_logprobs);
  task->start(requests);
}

}  // namespace servetune::server
