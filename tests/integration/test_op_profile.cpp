// SERVETUNE_PROFILE_OPS: an engine on a profiled backend gives the same greedy output as on the plain one, and when
// it shuts down the table it appends lists the ops a Llama forward pass runs, with their calls and tokens, and again
// split by tokens per call.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "backend/profiling_backend.h"
#include "integration/greedy_jobs.h"
#include "servetune/engine.h"
#include "test_paths.h"

namespace servetune {
namespace {

std::vector<std::vector<int32_t>> run(std::vector<testing::Job>& jobs) {
  EngineConfig c;
  c.model = testing::stories_path();
  c.threads = 2;
  c.max_total_tokens = 4096;
  Engine engine(c);
  if (jobs.empty()) jobs = testing::mixed_jobs(engine.tokenizer(), 6, 16);
  return testing::run_greedy(engine, jobs, true);
}

// calls and tokens of the table row whose op is exactly `op` (calls -1 when absent).
std::pair<long, long> row_of(const std::string& table, const std::string& op) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, m, std::regex("(.+?) +([0-9]+) +([0-9]+) +[0-9.]+ +[0-9.]+% +[0-9.]+")) &&
        m[1] == op) {
      return {std::stol(m[2]), std::stol(m[3])};
    }
  }
  return {-1, -1};
}

// calls and tokens summed over the "by tokens per call" rows of `op`, and how many size classes it has there.
struct SizedTotals {
  long calls = 0, tokens = 0, classes = 0;
};
SizedTotals sized_rows_of(const std::string& table, const std::string& op) {
  SizedTotals totals;
  std::istringstream lines(table);
  bool in_section = false;
  const std::regex row(
      "(.+?) +(1 token|2-16 tokens|17-64 tokens|65-512 tokens|>512 tokens) +([0-9]+) +([0-9]+) +[0-9.]+ +[0-9.]+% "
      "+[0-9.]+");
  for (std::string line; std::getline(lines, line);) {
    if (line == "by tokens per call") in_section = true;
    std::smatch m;
    if (in_section && std::regex_match(line, m, row) && m[1] == op) {
      totals.calls += std::stol(m[3]);
      totals.tokens += std::stol(m[4]);
      ++totals.classes;
    }
  }
  return totals;
}

TEST(OpProfile, TokensPerCallClasses) {
  EXPECT_EQ(tokens_per_call_class(1), 0);
  EXPECT_EQ(tokens_per_call_class(2), 1);
  EXPECT_EQ(tokens_per_call_class(16), 1);
  EXPECT_EQ(tokens_per_call_class(17), 2);
  EXPECT_EQ(tokens_per_call_class(64), 2);
  EXPECT_EQ(tokens_per_call_class(65), 3);
  EXPECT_EQ(tokens_per_call_class(512), 3);
  EXPECT_EQ(tokens_per_call_class(513), 4);
  EXPECT_STREQ(tokens_per_call_label(2), "17-64 tokens");
}

TEST(OpProfile, SameOutputAndATableOfTheForwardPassOps) {
  std::vector<testing::Job> jobs;
  const auto plain = run(jobs);
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("servetune_op_profile_" + std::to_string(getpid()) + ".txt");
  std::filesystem::remove(path);
  ASSERT_EQ(setenv("SERVETUNE_PROFILE_OPS", path.c_str(), 1), 0);
  const auto profiled = run(jobs);
  unsetenv("SERVETUNE_PROFILE_OPS");
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(profiled[i], plain[i]) << "request " << i;

  std::ifstream in(path);
  ASSERT_TRUE(in) << "no profile written to " << path;
  std::stringstream table;
  table << in.rdbuf();
  std::filesystem::remove(path);
  SCOPED_TRACE(table.str());
  EXPECT_NE(table.str().find("servetune op profile, backend 1 of this process (cpu;"), std::string::npos);
  // stories260K has 5 layers; the default compile = fused runs one rope+store, one attention per layer and step.
  const auto [attention_calls, attention_tokens] = row_of(table.str(), "attention");
  const auto [rope_calls, rope_tokens] = row_of(table.str(), "rope_store_qkv");
  ASSERT_GT(attention_calls, 0);
  EXPECT_EQ(attention_calls % 5, 0);
  EXPECT_EQ(rope_calls, attention_calls);
  EXPECT_EQ(rope_tokens, attention_tokens);
  EXPECT_EQ(attention_tokens % 5, 0);
  EXPECT_GT(row_of(table.str(), "embed").first, 0);
  EXPECT_GT(row_of(table.str(), "sample").first, 0);
  EXPECT_NE(table.str().find("matmul "), std::string::npos);
  // The split by tokens per call accounts for every attention call and token, in more than one class (prompt chunks
  // and single-token decode steps).
  const SizedTotals sized = sized_rows_of(table.str(), "attention");
  EXPECT_EQ(sized.calls, attention_calls);
  EXPECT_EQ(sized.tokens, attention_tokens);
  EXPECT_GE(sized.classes, 2);
}

}  // namespace
}  // namespace servetune
