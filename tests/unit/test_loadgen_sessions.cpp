// Sessions in the load generator: the dispatcher's order and timing rules (concurrency counts sessions, a turn
// waits for its previous reply plus the think time, a failed turn ends its session) and the multi-turn metrics
// computed from outputs with known timings.
#include <gtest/gtest.h>

#include <cmath>

#include "loadgen/dispatcher.h"
#include "loadgen/session_metrics.h"

namespace servetune::loadgen {
namespace {

std::vector<datasets::SampleRequest> sessions(int count, int turns) {
  std::vector<datasets::SampleRequest> v;
  for (int s = 0; s < count; ++s) {
    for (int t = 0; t < turns; ++t) {
      datasets::SampleRequest r;
      r.prompt = "s" + std::to_string(s) + "t" + std::to_string(t);
      r.prompt_len = 10 * (t + 1);
      r.output_len = 4;
      r.session = s;
      r.turn = t;
      v.push_back(r);
    }
  }
  return v;
}

RunSpec plan(const std::vector<datasets::SampleRequest>& reqs, int64_t cap, double think) {
  RunSpec spec;
  spec.sessions = true;
  spec.max_concurrency = cap;
  for (const auto& r : reqs) spec.requests.push_back({&r, 0.0, r.turn > 0 ? think : 0.0});
  return spec;
}

TEST(Dispatcher, ConcurrencyCountsSessionsAndTurnsWaitForTheReplyPlusThinkTime) {
  const auto reqs = sessions(2, 3);
  const RunSpec spec = plan(reqs, 1, 0.5);
  std::vector<RequestOutput> out(reqs.size());
  Dispatcher d(spec, out);
  auto l = d.next(0.0);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->index, 0u);
  EXPECT_FALSE(d.next(0.0));  // session 1 waits: one user at a time, though no request is in flight after a reply
  out[0].success = true;
  d.finished(0, 1.0);
  EXPECT_DOUBLE_EQ(d.next_time(), 1.5);
  EXPECT_FALSE(d.next(1.4));
  l = d.next(1.5);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->index, 1u);
  EXPECT_EQ(out[1].turn, 1);
  EXPECT_DOUBLE_EQ(out[1].ready_time, 1.5);
  out[1].success = true;
  d.finished(1, 2.0);
  EXPECT_FALSE(d.next(2.2));  // still session 0's slot: its third turn comes first
  l = d.next(2.5);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->index, 2u);
  out[2].success = true;
  d.finished(2, 3.0);
  l = d.next(3.0);  // session 0 done: session 1 starts, its ready time the freed slot's
  ASSERT_TRUE(l);
  EXPECT_EQ(l->index, 3u);
  EXPECT_DOUBLE_EQ(out[3].ready_time, 3.0);
}

TEST(Dispatcher, ArrivalsStartSessionsWithoutDelayingLaterTurns) {
  const auto reqs = sessions(2, 2);
  RunSpec spec = plan(reqs, 0, 0.0);
  spec.requests[2].scheduled_s = spec.requests[3].scheduled_s = 1.0;  // session 1 arrives at 1 s
  std::vector<RequestOutput> out(reqs.size());
  Dispatcher d(spec, out);
  EXPECT_EQ(d.next(0.0)->index, 0u);
  EXPECT_FALSE(d.next(0.5));  // a free slot, but session 1 has not arrived
  EXPECT_DOUBLE_EQ(d.next_time(), 1.0);
  out[0].success = true;
  d.finished(0, 0.5);
  EXPECT_EQ(d.next(0.5)->index, 1u);  // session 0's next turn does not wait for the arrival
  EXPECT_EQ(d.next(1.0)->index, 2u);
  EXPECT_DOUBLE_EQ(out[2].scheduled_time, 1.0);
}

TEST(Dispatcher, AFailedTurnEndsItsSessionUnsent) {
  const auto reqs = sessions(2, 3);
  const RunSpec spec = plan(reqs, 0, 0.0);
  std::vector<RequestOutput> out(reqs.size());
  Dispatcher d(spec, out);
  EXPECT_EQ(d.next(0.0)->index, 0u);
  EXPECT_EQ(d.next(0.0)->index, 3u);  // no cap: both sessions start
  out[0].success = false;
  d.finished(0, 1.0);
  EXPECT_EQ(out[1].failure, RequestFailure::kNotSent);
  EXPECT_EQ(out[2].failure, RequestFailure::kNotSent);
  EXPECT_EQ(out[2].turn, 2);
  out[3].success = true;
  d.finished(3, 1.0);
  EXPECT_EQ(d.next(1.0)->index, 4u);
  out[4].success = true;
  d.finished(4, 2.0);
  EXPECT_EQ(d.next(2.0)->index, 5u);
  out[5].success = true;
  d.finished(5, 3.0);
  EXPECT_TRUE(d.done());
}

TEST(Dispatcher, ServerHistoryRendersLaterTurnsWithTheRepliesReceived) {
  std::vector<datasets::SampleRequest> reqs = sessions(1, 3);
  for (auto& r : reqs) {
    for (int t = 0; t <= r.turn; ++t) {
      r.messages.push_back({"user", "q" + std::to_string(t)});
      if (t < r.turn) r.messages.push_back({"assistant", "dataset reply " + std::to_string(t)});
    }
  }
  RunSpec spec = plan(reqs, 0, 0.0);
  spec.render = [](datasets::SampleRequest& r) {
    r.prompt.clear();
    for (const auto& m : r.messages) r.prompt += m.content + "|";
  };
  std::vector<RequestOutput> out(reqs.size());
  Dispatcher d(spec, out);
  auto l = d.next(0.0);
  EXPECT_FALSE(l->rendered);
  out[0].success = true;
  out[0].generated_text = "server said A";
  d.finished(0, 0.0);
  l = d.next(0.0);
  ASSERT_TRUE(l && l->rendered);
  EXPECT_EQ(l->sample->prompt, "q0|server said A|q1|");
  out[1].success = true;
  out[1].generated_text = "server said B";
  d.finished(1, 0.0);
  EXPECT_EQ(d.next(0.0)->sample->prompt, "q0|server said A|q1|server said B|q2|");
}

TEST(Dispatcher, WithoutSessionsThePlanOrderAndRequestCapHold) {
  auto reqs = sessions(1, 3);  // turns of one session, but the plan does not say sessions
  RunSpec spec = plan(reqs, 2, 0.0);
  spec.sessions = false;
  spec.requests[1].scheduled_s = 0.1;
  spec.requests[2].scheduled_s = 0.2;
  std::vector<RequestOutput> out(reqs.size());
  Dispatcher d(spec, out);
  EXPECT_EQ(d.next(0.0)->index, 0u);
  EXPECT_FALSE(d.next(0.05));
  EXPECT_EQ(d.next(0.1)->index, 1u);
  EXPECT_FALSE(d.next(0.3));  // two in flight
  out[0].success = true;
  d.finished(0, 0.4);
  EXPECT_EQ(d.next(0.4)->index, 2u);
  EXPECT_DOUBLE_EQ(out[2].ready_time, 0.4);
}

RequestOutput done(int64_t session, int64_t turn, double start, double ttft, double latency) {
  RequestOutput o;
  o.success = true;
  o.session = session;
  o.turn = turn;
  o.start_time = start;
  o.ttft = ttft;
  o.latency = latency;
  o.output_tokens = 3;
  o.itl = {(latency - ttft) / 2, (latency - ttft) / 2};
  o.prompt_len = 100;
  return o;
}

TEST(SessionMetrics, FirstAndLaterTurnsAndSessionTimes) {
  std::vector<RequestOutput> outs = {done(0, 0, 0.0, 0.1, 0.3), done(0, 1, 1.0, 0.02, 0.22), done(0, 2, 2.0, 0.04, 0.24),
                                     done(1, 0, 0.5, 0.3, 0.5), done(1, 1, 2.0, 0.06, 0.26)};
  outs[1].cached_tokens = 80;
  outs[4].cached_tokens = 60;
  outs[4].prompt_len = 100;
  RequestOutput failed;
  failed.session = 2;
  failed.turn = 0;
  failed.error = "x";
  outs.push_back(failed);
  const SessionMetrics s = compute_session_metrics(outs, 3.0, {50});
  EXPECT_EQ(s.sessions, 3);
  EXPECT_EQ(s.completed_sessions, 2);
  EXPECT_EQ(s.first_turn.completed, 2);
  EXPECT_EQ(s.later_turns.completed, 3);
  EXPECT_NEAR(s.first_turn.ttft_ms.mean, 200.0, 1e-9);
  EXPECT_NEAR(s.later_turns.ttft_ms.mean, 40.0, 1e-9);
  EXPECT_NEAR(s.later_turns.tpot_ms.mean, 100.0, 1e-9);  // (0.22 - 0.02) / 2
  ASSERT_EQ(s.mean_ttft_ms_by_turn.size(), 3u);
  EXPECT_NEAR(s.mean_ttft_ms_by_turn[1], 40.0, 1e-9);
  EXPECT_NEAR(s.session_time_ms.mean, 0.5 * (2240.0 + 1760.0), 1e-9);  // 0 .. 2.24 and 0.5 .. 2.26
  EXPECT_NEAR(s.mean_turns, 2.0, 1e-12);
  EXPECT_FALSE(s.reported_cached_fraction_first.has_value());
  ASSERT_TRUE(s.reported_cached_fraction_later.has_value());
  EXPECT_NEAR(*s.reported_cached_fraction_later, 140.0 / 200.0, 1e-12);
}

}  // namespace
}  // namespace servetune::loadgen
