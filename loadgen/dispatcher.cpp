// Request and session dispatch shared by the clients (see dispatcher.h).
#include "loadgen/dispatcher.h"

#include <limits>

namespace servetune::loadgen {

Dispatcher::Dispatcher(const RunSpec& spec, std::vector<RequestOutput>& outputs)
    : spec_(spec), outputs_(outputs), n_(spec.requests.size()), session_of_(n_), rendered_(n_) {
  for (size_t i = 0; i < n_; ++i) {
    const datasets::SampleRequest* s = spec.requests[i].sample;
    const datasets::SampleRequest* prev = i > 0 ? spec.requests[i - 1].sample : nullptr;
    const bool starts = !spec.sessions || i == 0 || s->session != prev->session || s->turn == 0;
    if (starts) first_.push_back(i);
    session_of_[i] = starts ? i : session_of_[i - 1];
  }
}

bool Dispatcher::is_last_turn(size_t i) const { return i + 1 >= n_ || session_of_[i + 1] == i + 1; }

void Dispatcher::release_slot(double now) {
  if (spec_.max_concurrency > 0 && active_ == spec_.max_concurrency) slot_free_s_ = now;
  --active_;
}

Dispatcher::Launch Dispatcher::start(size_t i, double scheduled, double ready) {
  const datasets::SampleRequest* sample = spec_.requests[i].sample;
  bool rendered = false;
  const size_t first = session_of_[i];
  if (spec_.render && i != first) {
    // The history's assistant messages become the replies this session received: the j-th is turn j's (found by
    // role, as a system message may come first).
    auto copy = std::make_unique<datasets::SampleRequest>(*sample);
    size_t k = first;
    for (ChatMessage& m : copy->messages) {
      if (m.role == "assistant" && k < i) m.content = outputs_[k++].generated_text;
    }
    spec_.render(*copy);
    rendered_[i] = std::move(copy);
    sample = rendered_[i].get();
    rendered = true;
  }
  RequestOutput& o = outputs_[i];
  o.scheduled_time = scheduled;
  o.ready_time = ready;
  o.dataset_prompt_len = o.prompt_len = sample->prompt_len;
  o.session = sample->session;
  o.turn = sample->turn;
  ++in_flight_;
  return {i, sample, rendered};
}

std::optional<Dispatcher::Launch> Dispatcher::next(double now) {
  if (!later_.empty() && later_.top().at <= now) {
    const Due d = later_.top();
    later_.pop();
    return start(d.index, d.at, d.at);
  }
  const bool slot = spec_.max_concurrency <= 0 || active_ < spec_.max_concurrency;
  if (next_first_ < first_.size() && slot) {
    const size_t i = first_[next_first_];
    const double scheduled = spec_.requests[i].scheduled_s;
    if (scheduled <= now) {
      ++next_first_;
      ++active_;
      return start(i, scheduled, spec_.max_concurrency > 0 ? std::max(scheduled, slot_free_s_) : scheduled);
    }
  }
  return std::nullopt;
}

double Dispatcher::next_time() const {
  double t = std::numeric_limits<double>::infinity();
  if (!later_.empty()) t = later_.top().at;
  const bool slot = spec_.max_concurrency <= 0 || active_ < spec_.max_concurrency;
  if (next_first_ < first_.size() && slot) t = std::min(t, spec_.requests[first_[next_first_]].scheduled_s);
  return t;
}

void Dispatcher::finished(size_t i, double now) {
  --in_flight_;
  ++finished_;
  if (is_last_turn(i)) {
    release_slot(now);
    return;
  }
  if (outputs_[i].success) {
    later_.push({now + spec_.requests[i + 1].think_s, i + 1});
    return;
  }
  // The session cannot go on without this turn's reply: its remaining turns fail unsent.
  for (size_t k = i + 1; k < n_ && session_of_[k] == session_of_[i]; ++k) {
    RequestOutput& o = outputs_[k];
    const datasets::SampleRequest* s = spec_.requests[k].sample;
    o.success = false;
    o.failure = RequestFailure::kNotSent;
    o.error = "not sent: an earlier turn of its session failed";
    o.dataset_prompt_len = o.prompt_len = s->prompt_len;
    o.session = s->session;
    o.turn = s->turn;
    o.scheduled_time = o.ready_time = o.start_time = now;
    ++finished_;
  }
  release_slot(now);
}

}  // namespace servetune::loadgen
