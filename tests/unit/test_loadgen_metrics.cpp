// Metrics on synthetic timelines with answers worked out by hand (vLLM's definitions), percentiles against
// numpy 2.4.6 (np.percentile / np.median / np.std values pasted below), and the vLLM-shaped report.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "loadgen/client.h"
#include "loadgen/metrics.h"
#include "loadgen/report.h"

namespace servetune::loadgen {
namespace {

RequestOutput ok(double start, double ttft, std::vector<double> itl, int64_t out_tokens, int64_t prompt) {
  RequestOutput o;
  o.success = true;
  o.start_time = o.scheduled_time = o.ready_time = start;
  o.ttft = ttft;
  o.latency = ttft;
  for (double g : itl) o.latency += g;
  o.itl = std::move(itl);
  o.output_tokens = out_tokens;
  o.prompt_len = o.dataset_prompt_len = prompt;
  return o;
}

RequestOutput failed(const std::string& error) {
  RequestOutput o;
  o.error = error;
  return o;
}

TEST(Percentile, MatchesNumpyLinear) {
  // x = [0.5, 3.25, 1.0, 7.75, 2.0, 2.0, 10.5, 0.125, 4.0]; np.percentile(x, p)
  const std::vector<double> x = {0.5, 3.25, 1.0, 7.75, 2.0, 2.0, 10.5, 0.125, 4.0};
  const std::pair<double, double> expect[] = {{0, 0.125},   {1, 0.155},    {10, 0.42500000000000004}, {25, 1.0},
                                              {33.3, 1.6639999999999997}, {50, 2.0}, {75, 4.0},   {90, 8.3},
                                              {95, 9.399999999999999},    {99, 10.28}, {99.9, 10.478000000000002},
                                              {100, 10.5}};
  for (const auto& [p, v] : expect) EXPECT_NEAR(percentile_linear(x, p), v, 1e-12) << "p" << p;
  EXPECT_NEAR(percentile_linear({1.5, 2.5}, 99), 2.49, 1e-12);
  EXPECT_EQ(percentile_linear({}, 50), 0.0);
  const Summary s = summarize_ms(x, {99});
  EXPECT_NEAR(s.mean, 3458.3333333333335, 1e-9);  // np.mean * 1000
  EXPECT_NEAR(s.std, 3308.2388735465345, 1e-9);   // np.std (population) * 1000
  EXPECT_NEAR(s.median, 2000.0, 1e-9);
  EXPECT_NEAR(summarize_ms({1.0, 4.0}, {}).median, 2500.0, 1e-9);  // even count: mean of the middle two
  const Summary empty = summarize_ms({}, {50, 99});
  EXPECT_EQ(empty.mean, 0.0);
  ASSERT_EQ(empty.percentiles.size(), 2u);
  EXPECT_EQ(empty.percentiles[1].second, 0.0);
}

// The printed result block, as text.
std::string block_text(const BenchmarkMetrics& m, double duration_s, const ReportOptions& o) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  print_result_block(f, m, duration_s, o);
  std::fclose(f);
  std::string text(buf, len);
  std::free(buf);
  return text;
}

// R0: start 0, chunks at 0.1, 0.15, 0.2, 0.3 (4 tokens); R1: start 0.5, chunks at 0.7, 0.8 (2 tokens);
// R2: start 1.2, one chunk at 1.5 (1 token); R3 failed. Run duration 2 s.
std::vector<RequestOutput> timeline() {
  return {ok(0.0, 0.1, {0.05, 0.05, 0.1}, 4, 10), ok(0.5, 0.2, {0.1}, 2, 20), ok(1.2, 0.3, {}, 1, 30),
          failed("HTTP 500: boom\nstack")};
}

TEST(Metrics, SyntheticTimeline) {
  const BenchmarkMetrics m = compute_metrics(timeline(), 2.0, {50, 99}, {});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 60);
  EXPECT_EQ(m.total_output, 7);
  EXPECT_EQ(m.actual_output_lens, (std::vector<int64_t>{4, 2, 1, 0}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 33.5);
  EXPECT_NEAR(m.ttft_ms.mean, 200.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.median, 200.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.std, 1000.0 * std::sqrt(0.02 / 3.0), 1e-9);
  // TPOT only for outputs > 1 token: (0.3 - 0.1) / 3 and (0.3 - 0.2) / 1.
  EXPECT_NEAR(m.tpot_ms.mean, 1000.0 * (0.2 / 3.0 + 0.1) / 2.0, 1e-9);
  EXPECT_NEAR(m.itl_ms.mean, 75.0, 1e-9);
  EXPECT_NEAR(m.itl_ms.median, 75.0, 1e-9);
  EXPECT_NEAR(m.e2el_ms.mean, 300.0, 1e-9);
  EXPECT_NEAR(m.e2el_ms.std, 0.0, 1e-9);
  EXPECT_EQ(m.max_output_tokens_per_s, 6.0);  // chunks in second 0: 0.1 0.15 0.2 0.3 0.7 0.8
  EXPECT_EQ(m.max_concurrent_requests, 1);
  EXPECT_EQ(m.failure_reasons.at("HTTP 500: boom"), 1);
  EXPECT_EQ(m.request_goodput, 0.0);  // no SLO given
}

TEST(Metrics, Goodput) {
  const auto good = [](GoodputSlo slo) { return compute_metrics(timeline(), 2.0, {99}, slo).request_goodput * 2.0; };
  EXPECT_DOUBLE_EQ(good({250.0, std::nullopt, std::nullopt}), 2.0);  // TTFT 0.3 misses
  EXPECT_DOUBLE_EQ(good({200.0, std::nullopt, std::nullopt}), 2.0);  // equal to the SLO counts as met
  EXPECT_DOUBLE_EQ(good({99.0, std::nullopt, std::nullopt}), 0.0);
  // TPOT: R0 66.7 ms meets 70, R1 100 ms misses, R2 (1 token) counts as TPOT 0 and meets any TPOT SLO.
  EXPECT_DOUBLE_EQ(good({std::nullopt, 70.0, std::nullopt}), 2.0);
  EXPECT_DOUBLE_EQ(good({std::nullopt, 0.0, std::nullopt}), 1.0);
  EXPECT_DOUBLE_EQ(good({std::nullopt, std::nullopt, 300.5}), 3.0);
  EXPECT_DOUBLE_EQ(good({std::nullopt, std::nullopt, 300.0}), 1.0);  // R0's and R1's E2EL sum to 0.30000000000000004
  EXPECT_DOUBLE_EQ(good({250.0, 70.0, 300.5}), 1.0);  // every SLO must hold: only R0
  // Failed requests never count as good.
  EXPECT_DOUBLE_EQ(compute_metrics({failed("x")}, 1.0, {99}, {1e9, 1e9, 1e9}).request_goodput, 0.0);
}

TEST(Metrics, PeakConcurrencySweepLine) {
  const auto peak = [](std::vector<std::pair<double, double>> spans) {
    std::vector<RequestOutput> v;
    for (auto [s, e] : spans) v.push_back(ok(s, e - s, {}, 1, 1));
    return compute_metrics(v, 10.0, {99}, {}).max_concurrent_requests;
  };
  EXPECT_EQ(peak({{0, 1}, {1, 2}, {2, 3}}), 1);           // half-open: touching intervals do not overlap
  EXPECT_EQ(peak({{0, 1}, {0, 1}, {0, 1}}), 3);
  EXPECT_EQ(peak({{0, 10}, {1, 2}, {1.5, 3}, {2, 4}}), 3);  // [1,2) ends as [2,4) starts
  EXPECT_EQ(peak({{0, 5}, {4.999, 6}}), 2);
  EXPECT_EQ(peak({{5, 5}}), 0);  // a zero-length request: its end sorts before its start, as in vLLM
  EXPECT_EQ(compute_metrics({failed("a"), failed("b")}, 1.0, {99}, {}).max_concurrent_requests, 0);
}

TEST(Metrics, PeakOutputThroughputBuckets) {
  // Chunks at 0.9, 1.0, 1.1, 1.95, 2.5 after the first start 0 -> buckets [1, 3, 1].
  std::vector<RequestOutput> v = {ok(0.0, 0.9, {0.1, 0.1, 0.85}, 4, 1), ok(0.5, 2.0, {}, 1, 1)};
  const BenchmarkMetrics m = compute_metrics(v, 3.0, {99}, {});
  EXPECT_EQ(m.max_output_tokens_per_s, 3.0);
  EXPECT_EQ(m.max_concurrent_requests, 2);
}

TEST(Metrics, OutputTokenCountFallbackAndAdditions) {
  RequestOutput a = ok(0.0, 0.1, {0.02, 0.03}, 0, 5);  // server reported no usage
  a.generated_text = "one two three four five";
  a.chunk_tokens = {1, 2, 3};
  a.scheduled_time = 0.0;
  a.ready_time = 0.0;
  a.start_time = 0.004;
  const auto words = [](const std::string& t) { return static_cast<int64_t>(std::count(t.begin(), t.end(), ' ') + 1); };
  BenchmarkMetrics m = compute_metrics({a}, 1.0, {99}, {}, words);
  EXPECT_EQ(m.total_output, 5);
  EXPECT_NEAR(m.client_send_lag_ms.mean, 4.0, 1e-9);
  EXPECT_FALSE(m.client_lag_ms.has_value());  // no event carried a send stamp
  EXPECT_EQ(m.client_lag_events, 0);
  ASSERT_EQ(m.per_token_itl_ms.percentiles.size(), 1u);
  EXPECT_NEAR(m.per_token_itl_ms.mean, 10.0, 1e-9);  // 20 ms over 2 tokens, 30 ms over 3 tokens
  EXPECT_NEAR(m.per_token_itl_ms.std, 0.0, 1e-9);
  m = compute_metrics({a}, 1.0, {99}, {});
  EXPECT_EQ(m.total_output, 1);  // no tokenizer: one token, as vLLM without a tokenizer
}

// Read lags are per event over all requests, failed ones too (the client read those events): a server stamps
// R0's 3 events at 0.10, 0.15, 0.20 s, which the client reads at 0.1005, 0.1520, 0.2010 (lags 0.5, 2, 1 ms);
// R1's 1 event lags 4 ms; the failed R2 read 1 event 0.5 ms late; R3 came from a server without stamps.
// Lags 0.5, 0.5, 1, 2, 4 ms: mean 1.6, median 1, std sqrt(1.74), p50 1, p75 2, p90 3.2 (numpy linear).
TEST(Metrics, ClientReadLagOverEveryStampedEvent) {
  RequestOutput r0 = ok(0.0, 0.1, {0.05, 0.05}, 3, 1);
  r0.read_lags = {0.1005 - 0.10, 0.1520 - 0.15, 0.2010 - 0.20};
  RequestOutput r1 = ok(0.0, 0.2, {}, 1, 1);
  r1.read_lags = {0.004};
  RequestOutput r2 = failed("reset");
  r2.read_lags = {0.0005};
  const RequestOutput r3 = ok(0.0, 0.3, {}, 1, 1);
  const BenchmarkMetrics m = compute_metrics({r0, r1, r2, r3}, 1.0, {50, 75, 90}, {});
  ASSERT_TRUE(m.client_lag_ms.has_value());
  EXPECT_EQ(m.client_lag_events, 5);
  EXPECT_NEAR(m.client_lag_ms->mean, 1.6, 1e-9);
  EXPECT_NEAR(m.client_lag_ms->median, 1.0, 1e-9);
  EXPECT_NEAR(m.client_lag_ms->std, std::sqrt(1.74), 1e-9);
  ASSERT_EQ(m.client_lag_ms->percentiles.size(), 3u);
  EXPECT_NEAR(m.client_lag_ms->percentiles[0].second, 1.0, 1e-9);
  EXPECT_NEAR(m.client_lag_ms->percentiles[1].second, 2.0, 1e-9);
  EXPECT_NEAR(m.client_lag_ms->percentiles[2].second, 3.2, 1e-9);
  EXPECT_NEAR(m.client_send_lag_ms.mean, 0.0, 1e-12);  // every request went at its ready time
}

// Without stamps the read lag is absent: the block says so and the JSON has no client_lag keys (no zeros that
// look measured), while the send lag is still reported.
TEST(Report, ClientLagWithoutStampsIsNotApplicable) {
  RunResult run;
  run.outputs = timeline();
  run.duration_s = 2.0;
  ReportOptions o;
  o.percentile_metrics = {"client_lag", "client_send_lag"};
  o.percentiles = {99};
  const BenchmarkMetrics m = compute_metrics(run.outputs, run.duration_s, o.percentiles, o.slo);
  const std::string text = block_text(m, run.duration_s, o);
  EXPECT_NE(text.find("--------------Client Lag (servetune)--------------\n"
                      "Client Lag (ms):                         n/a (the server sent no timestamps)\n"
                      "-----------Client Send Lag (servetune)------------\n"
                      "Mean Client Send Lag (ms):               0.00      \n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("Mean Client Lag"), std::string::npos);
  const nlohmann::ordered_json j = metrics_json(m, run, o, true);
  EXPECT_FALSE(j.contains("mean_client_lag_ms"));
  EXPECT_FALSE(j.contains("p99_client_lag_ms"));
  EXPECT_EQ(j["client_lag_events"].get<int64_t>(), 0);
  EXPECT_TRUE(j.contains("p99_client_send_lag_ms"));
  EXPECT_EQ(j["client_lags"][0], nlohmann::ordered_json::array());
  EXPECT_EQ(j["client_send_lags"].size(), 4u);
}

TEST(Metrics, AllFailedGivesZeros) {
  const BenchmarkMetrics m = compute_metrics({failed("a"), failed("a"), failed("b")}, 1.0, {99}, {});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 3);
  EXPECT_EQ(m.ttft_ms.mean, 0.0);
  EXPECT_EQ(m.max_output_tokens_per_s, 0.0);
  EXPECT_EQ(m.failure_reasons.at("a"), 2);
}

TEST(Arrivals, InfinityPoissonAndConstant) {
  EXPECT_EQ(arrival_times(5, std::numeric_limits<double>::infinity(), 1.0, 0), std::vector<double>(5, 0.0));
  const std::vector<double> t = arrival_times(1000, 50.0, 1.0, 3);
  EXPECT_NEAR(t.back(), 20.0, 1e-9);  // rescaled so the last arrival is at n / rate
  for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
  EXPECT_EQ(t, arrival_times(1000, 50.0, 1.0, 3));
  EXPECT_NE(t, arrival_times(1000, 50.0, 1.0, 4));
  const std::vector<double> c = arrival_times(4, 2.0, std::numeric_limits<double>::infinity(), 0);
  EXPECT_EQ(c, (std::vector<double>{0.5, 1.0, 1.5, 2.0}));
  // Burstiness < 1 makes gaps more variable than Poisson: compare coefficients of variation.
  const auto cv = [](const std::vector<double>& x) {
    std::vector<double> g;
    for (size_t i = 1; i < x.size(); ++i) g.push_back(x[i] - x[i - 1]);
    double mean = 0, ss = 0;
    for (double v : g) mean += v;
    mean /= static_cast<double>(g.size());
    for (double v : g) ss += (v - mean) * (v - mean);
    return std::sqrt(ss / static_cast<double>(g.size())) / mean;
  };
  EXPECT_NEAR(cv(t), 1.0, 0.1);
  EXPECT_NEAR(cv(arrival_times(1000, 50.0, 0.25, 3)), 2.0, 0.25);  // gamma CV = 1/sqrt(shape)
  EXPECT_THROW(arrival_times(3, 0.0, 1.0, 0), Error);
  EXPECT_THROW(arrival_times(3, 1.0, 0.0, 0), Error);
}

TEST(Report, FlagParsing) {
  EXPECT_EQ(parse_metric_percentiles("25, 50,99.9"), (std::vector<double>{25, 50, 99.9}));
  EXPECT_THROW(parse_metric_percentiles("101"), Error);
  EXPECT_THROW(parse_metric_percentiles("abc"), Error);
  EXPECT_EQ(parse_percentile_metrics("ttft,e2el,client_lag,client_send_lag"),
            (std::vector<std::string>{"ttft", "e2el", "client_lag", "client_send_lag"}));
  EXPECT_THROW(parse_percentile_metrics("ttft,latency"), Error);
  const GoodputSlo slo = parse_goodput({"ttft:500", "tpot:50.5"});
  EXPECT_EQ(*slo.ttft, 500.0);
  EXPECT_EQ(*slo.tpot, 50.5);
  EXPECT_FALSE(slo.e2el.has_value());
  EXPECT_THROW(parse_goodput({"ttft=5"}), Error);
  EXPECT_THROW(parse_goodput({"itl:5"}), Error);
  EXPECT_THROW(parse_goodput({"ttft:-1"}), Error);
  EXPECT_EQ(percentile_word(99), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");
  EXPECT_EQ(percentile_word(50.0), "50");
}

TEST(Report, BlockAndJsonHaveVllmShape) {
  RunResult run;
  run.outputs = timeline();
  run.duration_s = 2.0;
  ReportOptions o;
  run.outputs[0].read_lags = {0.001};
  o.percentile_metrics = {"ttft", "tpot", "itl", "e2el", "client_lag", "client_send_lag"};
  o.percentiles = {50, 99.9};
  o.request_rate = 4.0;
  o.max_concurrency = 8;
  o.slo.ttft = 250.0;
  const BenchmarkMetrics m = compute_metrics(run.outputs, run.duration_s, o.percentiles, o.slo);
  const std::string text = block_text(m, run.duration_s, o);
  EXPECT_EQ(text.substr(0, 51), "============ Serving Benchmark Result ============\n");
  for (const char* line : {"Successful requests:                     3         \n",
                           "Failed requests:                         1         \n",
                           "Maximum request concurrency:             8         \n",
                           "Request rate configured (RPS):           4.00      \n",
                           "Benchmark duration (s):                  2.00      \n",
                           "Total input tokens:                      60        \n",
                           "Total generated tokens:                  7         \n",
                           "Request goodput (req/s):                 1.00      \n",
                           "Peak concurrent requests:                1.00      \n",
                           "---------------Time to First Token----------------\n",
                           "-----Time per Output Token (excl. 1st token)------\n",
                           "P99.9 TTFT (ms):                         299.80    \n",
                           "Median ITL (ms):                         75.00     \n",
                           "--------------Client Lag (servetune)--------------\n",
                           "Mean Client Lag (ms):                    1.00      \n",
                           "-----------Client Send Lag (servetune)------------\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  EXPECT_EQ(text.find("Client Queue"), std::string::npos);  // not selected
  const nlohmann::ordered_json j = metrics_json(m, run, o, false);
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  const std::vector<std::string> head = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                                         "request_throughput", "request_goodput", "output_throughput",
                                         "total_token_throughput"};
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 9), head);
  for (const char* k : {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99.9_ttft_ms", "mean_tpot_ms",
                        "p99.9_itl_ms", "mean_e2el_ms", "mean_client_lag_ms", "p99.9_client_send_lag_ms",
                        "max_output_tokens_per_s", "max_concurrent_requests", "latencies", "queue_times"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_FALSE(j.contains("ttfts"));  // per-request arrays only with --save-detailed
  EXPECT_TRUE(metrics_json(m, run, o, true).contains("ttfts"));
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 1.0);
  EXPECT_EQ(j["failure_reasons"]["HTTP 500: boom"].get<int>(), 1);
}

TEST(Report, SpeculativeDecodingSectionAndKeys) {
  RunResult run;
  run.outputs = timeline();
  run.duration_s = 2.0;
  ReportOptions o;
  o.percentile_metrics = {"ttft"};
  const BenchmarkMetrics m = compute_metrics(run.outputs, run.duration_s, o.percentiles, o.slo);
  auto block = [&] { return block_text(m, run.duration_s, o); };
  EXPECT_EQ(block().find("Speculative Decoding"), std::string::npos);  // only when the engine speculates
  EXPECT_FALSE(metrics_json(m, run, o, false).contains("spec_decode_acceptance_rate"));
  o.spec_decode = SpecDecodeStats{10, 40, 25, {9, 8, 5, 3}};
  const std::string text = block();
  for (const char* line : {"---------------Speculative Decoding---------------\n",
                           "Acceptance rate (%):                     62.50     \n",
                           "Acceptance length:                       3.50      \n",
                           "Drafts:                                  10        \n",
                           "Draft tokens:                            40        \n",
                           "Accepted tokens:                         25        \n",
                           "Per-position acceptance (%):\n",
                           "  Position 0:                            90.00     \n",
                           "  Position 3:                            30.00     \n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  const nlohmann::ordered_json j = metrics_json(m, run, o, false);
  EXPECT_DOUBLE_EQ(j["spec_decode_acceptance_rate"].get<double>(), 62.5);
  EXPECT_DOUBLE_EQ(j["spec_decode_acceptance_length"].get<double>(), 3.5);
  EXPECT_EQ(j["spec_decode_num_drafts"].get<int64_t>(), 10);
  EXPECT_EQ(j["spec_decode_draft_tokens"].get<int64_t>(), 40);
  EXPECT_EQ(j["spec_decode_accepted_tokens"].get<int64_t>(), 25);
  EXPECT_EQ(j["spec_decode_per_position_acceptance_rates"].size(), 4u);
  EXPECT_DOUBLE_EQ(j["spec_decode_per_position_acceptance_rates"][1].get<double>(), 0.8);
}

}  // namespace
}  // namespace servetune::loadgen
