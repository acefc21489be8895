// Reading speculative-decoding counters from a Prometheus exposition (vLLM's names) and differencing them.
#include <gtest/gtest.h>

#include "loadgen/server_metrics.h"

namespace servetune::loadgen {
namespace {

TEST(ServerMetrics, SpecDecodeCountersAreSummedOverLabelSets) {
  const char* text =
      "# HELP vllm:spec_decode_num_drafts_total Number of drafts.\n"
      "# TYPE vllm:spec_decode_num_drafts_total counter\n"
      "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 10\n"
      "vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"m\"} 5.0\n"
      "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} 60\n"
      "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 25 1700000000000\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"a,b=\\\"c\\\"\",position=\"1\"} 7\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\",model_name=\"m\"} 18\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\"} 99\n"  // no position: ignored
      "vllm:num_requests_running{model_name=\"m\"} 3\n"
      "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} not-a-number\n";
  const auto s = parse_spec_decode_counters(text);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->num_drafts, 15);
  EXPECT_EQ(s->draft_tokens, 60);
  EXPECT_EQ(s->accepted_tokens, 25);
  EXPECT_EQ(s->accepted_per_position, (std::vector<int64_t>{18, 7}));
}

TEST(ServerMetrics, NoDraftCounterMeansNoSpeculation) {
  EXPECT_FALSE(parse_spec_decode_counters("").has_value());
  EXPECT_FALSE(parse_spec_decode_counters("vllm:num_requests_running 1\nvllm:spec_decode_num_draft_tokens_total 4\n"));
  EXPECT_TRUE(parse_spec_decode_counters("vllm:spec_decode_num_drafts_total 0").has_value());  // no trailing newline
}

TEST(ServerMetrics, DifferenceIsPerCounterAndPerPosition) {
  const SpecDecodeStats before{4, 16, 9, {5, 4}};
  const SpecDecodeStats after{10, 40, 20, {9, 7, 4}};
  const SpecDecodeStats d = spec_decode_difference(after, before);
  EXPECT_EQ(d.num_drafts, 6);
  EXPECT_EQ(d.draft_tokens, 24);
  EXPECT_EQ(d.accepted_tokens, 11);
  EXPECT_EQ(d.accepted_per_position, (std::vector<int64_t>{4, 3, 4}));
}

TEST(ServerMetrics, UnreachableServerGivesNothing) {
  EXPECT_FALSE(http_get("http://127.0.0.1:1/metrics", 2000).has_value());
  EXPECT_FALSE(scrape_metrics("http://127.0.0.1:1/metrics", "").has_value());
}

}  // namespace
}  // namespace servetune::loadgen
