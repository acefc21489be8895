// Which planned request a client sends next, and when, for both clients. Without sessions: plan order at the
// scheduled times, at most max_concurrency requests in flight. With sessions (RunSpec::sessions): a session's first
// turn goes at its scheduled time while fewer than max_concurrency sessions are active (active from the first
// turn's send until the last turn finishes: concurrency counts users, not requests); each later turn think_s after
// its previous turn finished, so a session keeps its order. A failed turn ends its session: the turns left fail
// unsent (kNotSent). With RunSpec::render a later turn is re-rendered with the replies its session received.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <queue>
#include <vector>

#include "loadgen/client.h"

namespace servetune::loadgen {

class Dispatcher {
 public:
  // `outputs` has one entry per planned request; next() fills the times and identity of the one it returns,
  // finished() reads its success and generated text.
  Dispatcher(const RunSpec& spec, std::vector<RequestOutput>& outputs);

  struct Launch {
    size_t index;
    const datasets::SampleRequest* sample;  // what to send: the planned sample or its re-rendered copy
    bool rendered;                          // sample is a copy made at this launch (a client re-encodes its body)
  };
  // The next request due at `now` (seconds on the run's clock), or nullopt; its output's scheduled_time,
  // ready_time, prompt lengths, session and turn are set. The client sets start_time and sends it.
  std::optional<Launch> next(double now);
  // The earliest time next() can return a request without a finish happening first; +inf when none.
  double next_time() const;
  // Request i finished at `now` with its output complete.
  void finished(size_t i, double now);
  bool done() const { return finished_ == n_; }
  int64_t in_flight() const { return in_flight_; }

 private:
  struct Due {
    double at;
    size_t index;
    bool operator>(const Due& o) const { return at != o.at ? at > o.at : index > o.index; }
  };
  bool is_last_turn(size_t i) const;
  Launch start(size_t i, double scheduled, double ready);
  void release_slot(double now);

  const RunSpec& spec_;
  std::vector<RequestOutput>& outputs_;
  size_t n_ = 0;
  std::vector<size_t> first_;       // indices that start a session (every index without sessions), in plan order
  std::vector<size_t> session_of_;  // index -> its session's first turn
  size_t next_first_ = 0;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> later_;  // later turns whose predecessor finished
  std::vector<std::unique_ptr<datasets::SampleRequest>> rendered_;
  int64_t active_ = 0;     // sessions (or requests) holding a concurrency slot
  int64_t in_flight_ = 0;  // requests sent and not finished
  size_t finished_ = 0;
  double slot_free_s_ = 0.0;  // when a slot last freed while all were taken
};

}  // namespace servetune::loadgen
