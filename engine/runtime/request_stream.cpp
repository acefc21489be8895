// RequestStream: a mutex-protected event queue between the engine thread and one consumer.
#include "servetune/engine.h"

#include <utility>

namespace servetune {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

std::optional<TokenEvent> RequestStream::next(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock lock(mutex_);
  auto ready = [&] { return !events_.empty() || finished_; };
  if (timeout) {
    if (!cv_.wait_for(lock, *timeout, ready)) return std::nullopt;
  } else {
    cv_.wait(lock, ready);
  }
  if (events_.empty()) return std::nullopt;
  TokenEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

std::deque<TokenEvent> RequestStream::drain() {
  std::lock_guard lock(mutex_);
  return std::exchange(events_, {});
}

bool RequestStream::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

void RequestStream::set_notifier(std::function<void()> notify) {
  std::lock_guard lock(mutex_);
  notify_ = std::move(notify);
}

void RequestStream::push(TokenEvent event, bool notify_now) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    if (event.finish != FinishReason::kNone) finished_ = true;
    events_.push_back(std::move(event));
  }
  if (notify_now) notify();
}

void RequestStream::notify() {
  std::function<void()> notify;
  {
    std::lock_guard lock(mutex_);
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

}  // namespace servetune
