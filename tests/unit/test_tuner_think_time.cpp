// Think times from a trace file: its format and the errors that name the file and line, sampled (seeded, from the
// file's values) or replayed in order, and the flag combinations refused; fixed and exponential are
// test_tuner_measurement's.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>

#include "servetune/error.h"
#include "test_paths.h"
#include "tuner/think_time.h"

namespace servetune::tuner {
namespace {

// `sessions` sessions of `turns` turns each.
datasets::Workload sessions(int count, int turns) {
  datasets::Workload w;
  w.sessions = true;
  for (int s = 0; s < count; ++s) {
    for (int t = 0; t < turns; ++t) w.requests.push_back({"x", 1, 1, std::nullopt, "", s, t, {}});
  }
  return w;
}

std::string usage_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  return "no error";
}

TEST(ThinkTrace, OneNumberOfSecondsALineWithCommentsAndBlankLines) {
  const std::string path = testing::temp_file("think_ok.txt", "# seconds between turns\n0.5\n\n  2e-1 \r\n3\n0\n");
  EXPECT_EQ(read_think_trace(path), (std::vector<double>{0.5, 0.2, 3.0, 0.0}));
}

TEST(ThinkTrace, BadInputNamesTheFileAndLine) {
  const struct {
    const char* content;
    const char* says;
  } cases[] = {
      {"1\n2\nsoon\n", ":3: 'soon' is not a number of seconds >= 0"},
      {"1\n-0.5\n", ":2: '-0.5' is not a number"},
      {"nan\n", ":1: 'nan'"},
      {"inf\n", ":1: 'inf'"},
      {"1.5s\n", ":1: '1.5s'"},
      {"1 2\n", ":1: '1 2'"},
      {"# only a comment\n\n", "no think times"},
  };
  int k = 0;
  for (const auto& c : cases) {
    const std::string path = testing::temp_file("think_bad_" + std::to_string(k++) + ".txt", c.content);
    const std::string m = usage_message([&] { (void)read_think_trace(path); });
    EXPECT_EQ(m.rfind("--think-time-trace " + path, 0), 0u) << m;
    EXPECT_NE(m.find(c.says), std::string::npos) << c.content << " -> " << m;
  }
  EXPECT_NE(usage_message([] { (void)read_think_trace("/no/such/think.txt"); }).find("/no/such/think.txt: no such file"),
            std::string::npos);
}

TEST(ThinkTrace, ReplayGoesThroughTheFileInOrderAndWraps) {
  const std::string path = testing::temp_file("think_replay.txt", "0.1\n0.2\n0.3\n");
  const datasets::Workload w = sessions(2, 3);  // 4 later turns
  const std::vector<double> t = think_times(w, 0.0, "trace-replay", 1, path);
  EXPECT_EQ(t, (std::vector<double>{0.0, 0.1, 0.2, 0.0, 0.3, 0.1}));
  EXPECT_EQ(t, think_times(w, 0.0, "trace-replay", 2, path));  // no randomness
}

TEST(ThinkTrace, SampledDrawsTheFilesValuesSeeded) {
  const std::string path = testing::temp_file("think_sample.txt", "1\n2\n4\n8\n");
  const datasets::Workload w = sessions(50, 21);
  const std::vector<double> a = think_times(w, 0.0, "trace", 5, path);
  EXPECT_EQ(a, think_times(w, 0.0, "trace", 5, path));
  EXPECT_NE(a, think_times(w, 0.0, "trace", 6, path));
  std::map<double, int> seen;
  for (size_t i = 0; i < a.size(); ++i) {
    if (w.requests[i].turn == 0) {
      EXPECT_EQ(a[i], 0.0);
    } else {
      ++seen[a[i]];
    }
  }
  ASSERT_EQ(seen.size(), 4u);  // only the file's values, each about a quarter of 1000 draws (sd 14)
  for (const auto& [v, n] : seen) EXPECT_NEAR(n, 250, 60) << v;
}

TEST(ThinkTrace, FlagCombinationsThatCannotWorkAreRefused) {
  const std::string path = testing::temp_file("think_flags.txt", "1\n");
  EXPECT_NE(usage_message([] { check_think_time(0.0, "trace"); }).find("--think-time-dist trace needs --think-time-trace FILE"),
            std::string::npos);
  EXPECT_NE(usage_message([&] { check_think_time(0.0, "fixed", path); }).find("needs --think-time-dist trace or trace-replay"),
            std::string::npos);
  EXPECT_NE(usage_message([&] { check_think_time(2.0, "trace-replay", path); }).find("--think-time does not apply"),
            std::string::npos);
  EXPECT_NE(usage_message([] { check_think_time(0.0, "replay"); }).find("fixed, exponential, trace or trace-replay"),
            std::string::npos);
  EXPECT_NE(usage_message([] { check_think_time(0.0, "trace", "/no/such/file"); }).find("/no/such/file"), std::string::npos);
  check_think_time(0.0, "trace", path);  // fine
}

}  // namespace
}  // namespace servetune::tuner
