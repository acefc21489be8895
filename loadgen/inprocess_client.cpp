// In-process engine client (see inprocess_client.h). One thread: submits due requests, sleeps on a condition
// variable that stream notifiers signal, and on each wake-up drains every stream in flight (the engine queues a
// step's events on all streams before its first notification, so one pass takes the whole step).
#include "loadgen/inprocess_client.h"

#include <chrono>
#include <condition_variable>
#include <functional>
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

  const Clock::time_point t0 = Clock::now();
  const auto secs = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  size_t next = 0, finished = 0;
  int64_t inflight = 0;
  double slot_free_s = 0.0;
  const auto can_launch = [&] { return spec.max_concurrency <= 0 || inflight < spec.max_concurrency; };

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
    if (spec.max_concurrency > 0 && inflight == spec.max_concurrency) slot_free_s = secs(Clock::now());
    --inflight;
    ++finished;
    tracked[i].stream.reset();
  };

  const auto launch_due = [&] {
    while (next < n && can_launch() && spec.requests[next].scheduled_s <= secs(Clock::now())) {
      const size_t i = next++;
      const PlannedRequest& p = spec.requests[i];
      RequestOutput& o = result.outputs[i];
      o.scheduled_time = p.scheduled_s;
      o.ready_time = spec.max_concurrency > 0 ? std::max(p.scheduled_s, slot_free_s) : p.scheduled_s;
      o.dataset_prompt_len = o.prompt_len = p.sample->prompt_len;
      Request req;
      req.prompt = p.sample->prompt;
      req.add_special_tokens = true;
      req.parse_special = false;
      req.detokenize = spec.keep_text;
      req.sampling.max_tokens = static_cast<int32_t>(p.sample->output_len);
      req.sampling.ignore_eos = spec.params.ignore_eos;
      if (spec.params.temperature) req.sampling.temperature = static_cast<float>(*spec.params.temperature);
      if (spec.params.top_p) req.sampling.top_p = static_cast<float>(*spec.params.top_p);
      if (spec.params.top_k) req.sampling.top_k = *spec.params.top_k;
      ++inflight;
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

  while (finished < n) {
    launch_due();
    bool drain = false;
    {
      std::unique_lock<std::mutex> lock(wake->mutex);
      if (!wake->signaled && finished < n) {
        const auto poll_at = Clock::now() + kPollInterval;
        auto until = poll_at;
        if (next < n && can_launch()) {
          until = std::min(until, t0 + std::chrono::ceil<Clock::duration>(
                                           std::chrono::duration<double>(spec.requests[next].scheduled_s)));
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
