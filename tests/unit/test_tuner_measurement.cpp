// The measurement shared by `bench` and the sweep, against a scripted client (no engine, no server): which requests
// the warm-ups send, the measured plan (arrivals, cap, sampling fields), generated tokens counted with the tokenizer
// when no usage came back, the first failure with its kind, and only the parts the options switch on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

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

}  // namespace
}  // namespace servetune::tuner
