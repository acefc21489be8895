// In-process engine client (see inprocess_client.h). One thread: submits due requests, sleeps on a condition
// variable that stream notifiers signal, and on each wake-up drains every stream in flight (the engine queues a
// step's events on all streams before its first notification, so one pass takes the whole step).
#include "loadgen/inprocess_client.h"

#include "loadgen/dispatcher.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>

#include "servetune/engine.h"
#include "servetune/error.h"

namespace servetune::loadgen {
namespace {

using Clock = EngineClock;

// Shared with the streams' notifiers, which the engine thread may call after run() has returned.
struct Wakeup {
  std::mutex mutex;
  std::condition_variable cv;
  bool signaled = false;
};

constexpr auto kPollInterval = std::chrono::milliseconds(100);

struct Tracked {
  std::shared_ptr<RequestStream> stream;
  bool first = false;
  bool done = false;
  double last_ts = 0.0;
};

}  // namespace

RunResult InProcessClient::run(const RunSpec& spec) {
  const size_t n = spec.requests.size();
  RunResult result;
  result.outputs.resize(n);
  std::vector<Tracked> tracked(n);
  auto wake = std::make_shared<Wakeup>();
  // Every stream's notifier; given to submit, so no event is pushed before it is set.
  const std::function<void()> notify = [wake] {
    std::lock_guard<std::mutex> lock(wake->mutex);
    wake->signaled = true;
    wake->cv.notify_one();
  };
  std::vector<size_t> open;  // launched, not completed
  Dispatcher dispatch(spec, result.outputs);

  const Clock::time_point t0 = Clock::now();
  const auto secs = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };

  const auto complete = [&](size_t i, RequestFailure failure, const std::string& error) {
    RequestOutput& o = result.outputs[i];
    tracked[i].done = true;
    o.success = failure == RequestFailure::kNone;
    o.failure = failure;
    o.error = error;
    o.latency = tracked[i].first ? tracked[i].last_ts - o.start_time : 0.0;
    if (o.success && !tracked[i].first) {
      o.success = false;
      o.failure = RequestFailure::kBadResponse;
      o.error = "Never received a valid chunk to calculate TTFT.";
    }
    tracked[i].stream.reset();
    dispatch.finished(i, secs(Clock::now()));
  };

  const auto launch_due = [&] {
    while (const auto l = dispatch.next(secs(Clock::now()))) {
      const size_t i = l->index;
      const datasets::SampleRequest& sample = *l->sample;
      RequestOutput& o = result.outputs[i];
      Request req;
      req.prompt = sample.prompt;
      // A chat-templated turn spells its special tokens (BOS included) as text, as a chat server encodes it.
      const bool templated = !sample.messages.empty();
      req.add_special_tokens = !templated;
      req.parse_special = templated;
      req.detokenize = spec.keep_text;
      req.sampling.max_tokens = static_cast<int32_t>(sample.output_len);
      req.sampling.ignore_eos = spec.params.ignore_eos;
      if (spec.params.temperature) req.sampling.temperature = static_cast<float>(*spec.params.temperature);
      if (spec.params.top_p) req.sampling.top_p = static_cast<float>(*spec.params.top_p);
      if (spec.params.top_k) req.sampling.top_k = *spec.params.top_k;
      o.start_time = secs(Clock::now());
      try {
        tracked[i].stream = engine_.submit(std::move(req), notify);
      } catch (const Error& e) {
        complete(i, RequestFailure::kRejected, std::string("rejected by the engine: ") + e.what());
        continue;
      }
      open.push_back(i);
    }
  };

  const auto handle = [&](size_t i) {
    Tracked& t = tracked[i];
    if (t.done || !t.stream) return;
    RequestOutput& o = result.outputs[i];
    for (TokenEvent& e : t.stream->drain()) {
      const double ts = secs(e.time);
      // Read lag: the engine stamped the event with the same steady clock in this process.
      o.read_lags.push_back(secs(Clock::now()) - ts);
      if (!e.token_ids.empty()) {
        if (!t.first) {
          t.first = true;
          o.ttft = ts - o.start_time;
        } else {
          o.itl.push_back(ts - t.last_ts);
        }
        t.last_ts = ts;
        o.chunk_tokens.push_back(static_cast<int32_t>(e.token_ids.size()));
        if (spec.keep_text) o.generated_text += e.text;
      }
      if (e.finish != FinishReason::kNone) {
        o.prompt_len = e.usage.prompt_tokens;
        o.output_tokens = e.usage.completion_tokens;
        o.cached_tokens = e.usage.cached_tokens;
        if (e.finish == FinishReason::kError) {
          complete(i, RequestFailure::kServerError, "engine error: " + e.error);
        } else if (e.finish == FinishReason::kAbort) {
          complete(i, RequestFailure::kAborted, "aborted by the engine");
        } else {
          complete(i, RequestFailure::kNone, "");
        }
        return;
      }
    }
  };

  while (!dispatch.done()) {
    launch_due();
    bool drain = false;
    {
      std::unique_lock<std::mutex> lock(wake->mutex);
      if (!wake->signaled && !dispatch.done()) {
        const auto poll_at = Clock::now() + kPollInterval;
        auto until = poll_at;
        if (const double due = dispatch.next_time(); due < std::numeric_limits<double>::infinity()) {
          until = std::min(until, t0 + std::chrono::ceil<Clock::duration>(std::chrono::duration<double>(due)));
        }
        const bool woken = wake->cv.wait_until(lock, until, [&] { return wake->signaled; });
        drain = woken || until == poll_at;  // polled too: a lost wake-up must not hang the run
      }
      drain = drain || wake->signaled;
      wake->signaled = false;
    }
    if (!drain) continue;
    for (size_t i : open) handle(i);
    std::erase_if(open, [&](size_t i) { return tracked[i].done; });
  }
  result.duration_s = secs(Clock::now());
  return result;
}

}  // namespace servetune::loadgen
