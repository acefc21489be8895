// The measurement shared by `bench` and the sweep, against a scripted client (no engine, no server): which requests
// the warm-ups send, the measured plan (arrivals, cap, sampling fields; sessions and think times), generated tokens
// counted with the tokenizer when no usage came back, the first failure with its kind, and only the parts the
// options switch on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "servetune/error.h"
#include "servetune/tokenizer.h"
#include "test_paths.h"
#include "tuner/measurement.h"

namespace servetune::tuner {
namespace {

// Answers every planned request at once: a success with the sample's output_len tokens, or (for prompts starting
// with "fail:") a timed-out request. Keeps each plan it was given.
class ScriptedClient : public loadgen::Client {
 public:
  loadgen::RunResult run(const loadgen::RunSpec& spec) override {
    plans.push_back(spec);
    loadgen::RunResult r;
    r.duration_s = 0.5;
    for (const auto& p : spec.requests) {
      loadgen::RequestOutput o;
      o.scheduled_time = o.ready_time = o.start_time = p.scheduled_s;
      o.prompt_len = o.dataset_prompt_len = p.sample->prompt_len;
      o.session = p.sample->session;  // as the clients' dispatcher records them
      o.turn = p.sample->turn;
      if (p.sample->prompt.rfind("fail:", 0) == 0) {
        o.failure = loadgen::RequestFailure::kTimedOut;
        o.error = "request timed out after 1 s";
      } else {
        o.success = true;
        o.ttft = 0.01;
        o.latency = 0.05;
        o.output_tokens = report_usage ? p.sample->output_len : 0;
        o.generated_text = " once upon a time";
      }
      r.outputs.push_back(o);
    }
    return r;
  }
  bool report_usage = true;
  std::vector<loadgen::RunSpec> plans;
};

datasets::Workload workload(const std::vector<std::string>& prompts) {
  datasets::Workload w;
  w.dataset_name = "scripted";
  for (size_t i = 0; i < prompts.size(); ++i) {
    w.requests.push_back({prompts[i], 4, static_cast<int64_t>(3 + i), std::nullopt, std::to_string(i)});
  }
  return w;
}

std::unique_ptr<Tokenizer> stories_tokenizer() {
  return Tokenizer::from_path(servetune::testing::stories_path());
}

TEST(Measurement, WarmupsSendTheFirstRequestOrCycle) {
  const datasets::Workload w = workload({"a", "b", "c"});
  ScriptedClient client;
  MeasureOptions o;
  EXPECT_EQ(warm_up(client, w, o).sent, 0);  // no warm-ups: the client is not called
  EXPECT_TRUE(client.plans.empty());
  o.num_warmups = 4;
  o.max_concurrency = 2;
  EXPECT_EQ(warm_up(client, w, o).sent, 4);
  o.warmups = WarmupRequests::kCycle;
  warm_up(client, w, o);
  ASSERT_EQ(client.plans.size(), 2u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(client.plans[0].requests[i].sample, &w.requests[0]);      // vLLM's: the first request each time
    EXPECT_EQ(client.plans[1].requests[i].sample, &w.requests[i % 3]);  // the sweep's: in turn
    EXPECT_EQ(client.plans[1].requests[i].scheduled_s, 0.0);
  }
  EXPECT_EQ(client.plans[0].max_concurrency, 2);
  const WarmupOutcome failed = warm_up(client, workload({"fail:x"}), o);
  EXPECT_EQ(failed.failed, 4);
  EXPECT_EQ(failed.first_error, "request timed out after 1 s");
}

TEST(Measurement, PlanMetricsAndFirstFailure) {
  const auto tokenizer = stories_tokenizer();
  const datasets::Workload w = workload({"a", "fail:b", "c", "fail:d"});
  ScriptedClient client;
  client.report_usage = false;  // generated tokens are counted with the tokenizer
  MeasureOptions o;
  o.request_rate = std::numeric_limits<double>::infinity();
  o.max_concurrency = 3;
  o.params.ignore_eos = true;
  o.params.temperature = 0.5;
  o.percentiles = {50, 99};
  o.percentile_metrics = {"ttft"};
  const Measurement m = measure(client, w, o, *tokenizer);
  ASSERT_EQ(client.plans.size(), 1u);
  const loadgen::RunSpec& plan = client.plans[0];
  ASSERT_EQ(plan.requests.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(plan.requests[i].sample, &w.requests[i]);
    EXPECT_EQ(plan.requests[i].scheduled_s, 0.0);  // rate inf: every request at the start
  }
  EXPECT_EQ(plan.max_concurrency, 3);
  EXPECT_TRUE(plan.params.ignore_eos);
  EXPECT_EQ(plan.params.temperature, 0.5);
  EXPECT_EQ(m.metrics.completed, 2);
  EXPECT_EQ(m.metrics.failed, 2);
  const int64_t counted = static_cast<int64_t>(tokenizer->encode(" once upon a time", false, false).size());
  EXPECT_GT(counted, 1);
  EXPECT_EQ(m.metrics.total_output, 2 * counted);
  ASSERT_NE(m.first_failure(), nullptr);
  EXPECT_EQ(m.first_failure(), &m.run.outputs[1]);
  EXPECT_EQ(m.first_failure()->failure, loadgen::RequestFailure::kTimedOut);
  EXPECT_EQ(m.report.percentiles, (std::vector<double>{50, 99}));
  EXPECT_EQ(m.report.percentile_metrics, (std::vector<std::string>{"ttft"}));
  EXPECT_TRUE(std::isinf(m.report.request_rate));
  EXPECT_EQ(m.report.max_concurrency, 3);
}

TEST(Measurement, OnlyTheAskedPartsAreMeasured) {
  const auto tokenizer = stories_tokenizer();
  const datasets::Workload w = workload({"a", "b"});
  ScriptedClient client;
  MeasureOptions o;
  o.request_rate = 10.0;
  o.server_metrics_url = "http://127.0.0.1:1/metrics";  // nothing listens: no counters, the run goes on
  Measurement m = measure(client, w, o, *tokenizer);
  EXPECT_FALSE(m.report.spec_decode.has_value());
  EXPECT_FALSE(m.stats_before.has_value());
  EXPECT_TRUE(engine_stats_json(m).empty());
  EXPECT_TRUE(cpu_json(m).empty());
  // A finite rate spreads the arrivals (the last at n / rate).
  EXPECT_LT(client.plans[0].requests[0].scheduled_s, client.plans[0].requests[1].scheduled_s);
  EXPECT_NEAR(client.plans[0].requests[1].scheduled_s, 0.2, 1e-9);

  o.process_cpu = true;  // bench: CPU time only, no calibration keys
  m = measure(client, w, o, *tokenizer);
  const nlohmann::ordered_json cpu = cpu_json(m);
  ASSERT_EQ(cpu.size(), 1u) << cpu.dump();
  EXPECT_GE(cpu["process_cpu_s"].get<double>(), 0.0);

  o.process_cpu = false;
  o.calibrate_cpu = true;  // the sweep on the built-in engine
  m = measure(client, w, o, *tokenizer);
  const nlohmann::ordered_json calibrated = cpu_json(m);
  ASSERT_EQ(calibrated.size(), 4u) << calibrated.dump();
  EXPECT_GT(calibrated["calibration_ms"].get<double>(), 0.0);
  EXPECT_TRUE(calibrated.contains("cpu_ms_per_token"));
  EXPECT_TRUE(calibrated.contains("calibrated_cpu_per_token"));
}

// A multi-turn plan: the arrival process starts sessions (first turns get its times in order), later turns carry
// their think times (fixed, or exponential with that mean and seeded), and the result gets the session metrics.
TEST(Measurement, SessionsGetArrivalsPerSessionAndThinkTimes) {
  datasets::Workload w = workload({"s0t0", "s0t1", "s0t2", "s1t0", "s1t1", "s2t0"});
  const int64_t session[] = {0, 0, 0, 1, 1, 2}, turn[] = {0, 1, 2, 0, 1, 0};
  for (size_t i = 0; i < w.requests.size(); ++i) {
    w.requests[i].session = session[i];
    w.requests[i].turn = turn[i];
  }
  w.sessions = true;
  ScriptedClient client;
  MeasureOptions o;
  o.request_rate = 2.0;
  o.arrival_seed = 5;
  o.think_time_s = 0.25;
  const auto tok = stories_tokenizer();
  const Measurement m = measure(client, w, o, *tok);
  const loadgen::RunSpec& plan = client.plans.back();
  EXPECT_TRUE(plan.sessions);
  const std::vector<double> arrivals = loadgen::arrival_times(3, 2.0, 1.0, 5);
  EXPECT_DOUBLE_EQ(plan.requests[0].scheduled_s, arrivals[0]);
  EXPECT_DOUBLE_EQ(plan.requests[3].scheduled_s, arrivals[1]);
  EXPECT_DOUBLE_EQ(plan.requests[5].scheduled_s, arrivals[2]);
  for (size_t i = 0; i < plan.requests.size(); ++i) EXPECT_DOUBLE_EQ(plan.requests[i].think_s, turn[i] > 0 ? 0.25 : 0.0);
  ASSERT_TRUE(m.report.sessions.has_value());
  EXPECT_EQ(m.report.sessions->sessions, 3);
  EXPECT_EQ(m.report.sessions->later_turns.completed, 3);

  const std::vector<double> a = think_times(w, 0.25, "exponential", 9);
  EXPECT_EQ(a, think_times(w, 0.25, "exponential", 9));
  EXPECT_NE(a, think_times(w, 0.25, "exponential", 10));
  EXPECT_EQ(a[0], 0.0);
  EXPECT_GT(a[1], 0.0);
  EXPECT_NE(a[1], a[2]);
  double sum = 0.0;
  datasets::Workload many;
  for (int i = 0; i < 20000; ++i) many.requests.push_back({"x", 1, 1, std::nullopt, "", 0, i == 0 ? 0 : 1, {}});
  for (double t : think_times(many, 0.25, "exponential", 1)) sum += t;
  EXPECT_NEAR(sum / 19999.0, 0.25, 0.01);  // the mean asked for (4 standard errors)
  EXPECT_THROW(think_times(w, -1.0, "fixed", 0), Error);
  EXPECT_THROW(think_times(w, 1.0, "lognormal", 0), Error);
}

}  // namespace
}  // namespace servetune::tuner
