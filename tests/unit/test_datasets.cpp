// Datasets: portable randomness (CPython and C++-standard reference values), token-stable prompts, determinism
// of the random / trace / prefix workloads, their length rules and their errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "datasets/dataset.h"
#include "datasets/rng.h"
#include "datasets/token_prompt.h"
#include "formats/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune::datasets {
namespace {

const Tokenizer& stories() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    GgufFile gguf(testing::stories_path());
    return Tokenizer::from_gguf(gguf);
  }();
  return *tok;
}

// Values printed by CPython 3.11: random.seed(0); [random.getrandbits(32) for _ in range(3)], random.random(), ...
TEST(PyRandom, MatchesCPython) {
  PyRandom a(0);
  EXPECT_EQ(a.getrandbits(32), 3626764237u);
  EXPECT_EQ(a.getrandbits(32), 1654615998u);
  EXPECT_EQ(a.getrandbits(32), 3255389356u);
  PyRandom b(0);
  EXPECT_DOUBLE_EQ(b.random(), 0.8444218515250481);
  PyRandom c(12345678901ull);  // a seed wider than 32 bits
  std::vector<int> v(20);
  for (int i = 0; i < 20; ++i) v[i] = i;
  c.shuffle(v);
  EXPECT_EQ(v, (std::vector<int>{1, 6, 0, 9, 8, 18, 13, 7, 4, 16, 15, 14, 5, 2, 17, 3, 11, 12, 10, 19}));
  PyRandom d(0);
  std::vector<size_t> picks;
  for (int i = 0; i < 10; ++i) picks.push_back(d.choice_index(7));
  EXPECT_EQ(picks, (std::vector<size_t>{6, 3, 6, 3, 0, 2, 4, 3, 3, 6}));
  PyRandom e((1ull << 40) + 5);
  EXPECT_EQ(e.getrandbits(64), 9535518150286577956ull);
  EXPECT_EQ(e.getrandbits(40), 727003120297ull);
}

TEST(Rng, EngineIsTheStandardOne) {
  // [rand.predef]: the 10000th output of a default-constructed mt19937_64 is 9981545732273789042.
  Rng r(5489u);
  for (int i = 0; i < 9999; ++i) r.next_u64();
  EXPECT_EQ(r.next_u64(), 9981545732273789042ull);
}

TEST(Rng, DistributionsStayInRangeAndHaveTheRightMean) {
  Rng r(7);
  double sum = 0.0, gsum = 0.0, gsmall = 0.0;
  constexpr int kN = 200000;
  for (int i = 0; i < kN; ++i) {
    const int64_t x = r.uniform_int(-3, 5);
    ASSERT_GE(x, -3);
    ASSERT_LE(x, 5);
    sum += static_cast<double>(x);
    gsum += r.gamma(2.0, 0.5);     // mean 1
    gsmall += r.gamma(0.3, 2.0);   // mean 0.6, exercises the shape < 1 path
  }
  EXPECT_NEAR(sum / kN, 1.0, 0.03);
  EXPECT_NEAR(gsum / kN, 1.0, 0.01);
  EXPECT_NEAR(gsmall / kN, 0.6, 0.01);
  EXPECT_EQ(r.below(1), 0u);
}

TEST(TokenPrompt, MakeValidUtf8ReplacesMaximalIllFormedSubparts) {
  EXPECT_EQ(make_valid_utf8("abc"), "abc");
  EXPECT_EQ(make_valid_utf8("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(make_valid_utf8("a\xE2\x82"), "a\xEF\xBF\xBD");             // truncated 3-byte sequence: one U+FFFD
  EXPECT_EQ(make_valid_utf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");   // two invalid bytes
  EXPECT_EQ(make_valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(make_valid_utf8("\xF0\x9F\x98\x80x"), "\xF0\x9F\x98\x80x");
}

TEST(TokenPrompt, StablePromptReencodesToTheTargetLength) {
  const Tokenizer& tok = stories();
  const std::vector<int32_t> allowed = allowed_token_ids(tok);
  Rng rng(1);
  for (size_t target : {1u, 5u, 33u, 200u}) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < target; ++i) ids.push_back(allowed[rng.below(allowed.size())]);
    const StablePrompt p = make_stable_prompt(tok, ids, target, allowed, rng);
    EXPECT_EQ(p.ids.size(), target);
    EXPECT_EQ(tok.encode(p.text, false, false), p.ids);
  }
}

DatasetOptions random_options(uint64_t seed) {
  DatasetOptions o;
  o.name = "random";
  o.num_prompts = 40;
  o.seed = seed;
  o.random_input_len = 48;
  o.random_output_len = 20;
  o.random_range_ratio = 0.25;
  return o;
}

TEST(RandomDataset, SameSeedSameRequestsOtherSeedOthers) {
  const Workload a = load_workload(random_options(3), stories());
  const Workload b = load_workload(random_options(3), stories());
  const Workload c = load_workload(random_options(4), stories());
  ASSERT_EQ(a.requests.size(), 40u);
  int differing = 0;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].prompt, b.requests[i].prompt);
    EXPECT_EQ(a.requests[i].output_len, b.requests[i].output_len);
    differing += a.requests[i].prompt != c.requests[i].prompt;
  }
  EXPECT_GT(differing, 30);
}

TEST(RandomDataset, LengthsFollowTheRangeAndTheServerSeesThem) {
  const Tokenizer& tok = stories();  // adds BOS: 1 special token
  const Workload w = load_workload(random_options(9), tok);
  // vLLM: real input 47 -> [floor(47*0.75), ceil(47*1.25)] = [35, 59], + BOS; output [15, 25].
  for (const SampleRequest& r : w.requests) {
    EXPECT_GE(r.prompt_len, 36);
    EXPECT_LE(r.prompt_len, 60);
    EXPECT_GE(r.output_len, 15);
    EXPECT_LE(r.output_len, 25);
    EXPECT_EQ(static_cast<int64_t>(tok.encode(r.prompt, true, false).size()), r.prompt_len);
  }
  EXPECT_EQ(w.info["prompts_off_target"].get<int64_t>(), 0);

  DatasetOptions s = random_options(9);
  s.random_range_mode = "sglang";
  s.random_range_ratio = 0.5;  // SGLang: [max(int(47*0.5), 1), 47] + BOS; output [10, 20]
  for (const SampleRequest& r : load_workload(s, tok).requests) {
    EXPECT_GE(r.prompt_len, 24);
    EXPECT_LE(r.prompt_len, 48);
    EXPECT_GE(r.output_len, 10);
    EXPECT_LE(r.output_len, 20);
  }
}

TEST(RandomDataset, SharedPrefixIsShared) {
  DatasetOptions o = random_options(2);
  o.random_prefix_len = 30;
  o.random_range_ratio = 0.0;
  const Workload w = load_workload(o, stories());
  const std::vector<int32_t> first = stories().encode(w.requests[0].prompt, true, false);
  for (const SampleRequest& r : w.requests) {
    const std::vector<int32_t> ids = stories().encode(r.prompt, true, false);
    ASSERT_GE(ids.size(), 26u);
    EXPECT_TRUE(std::equal(first.begin(), first.begin() + 25, ids.begin())) << r.id;  // BOS + the prefix, less the seam
  }
}

TEST(RandomDataset, BadValuesAreUsageErrors) {
  DatasetOptions o = random_options(0);
  o.random_range_ratio = 1.0;
  EXPECT_THROW(load_workload(o, stories()), Error);
  o = random_options(0);
  o.random_range_mode = "other";
  EXPECT_THROW(load_workload(o, stories()), Error);
  o = random_options(0);
  o.random_input_len = 1;  // only the BOS would remain
  try {
    load_workload(o, stories());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("--random-input-len"), std::string::npos);
  }
  o = random_options(0);
  o.num_prompts = 0;
  EXPECT_THROW(load_workload(o, stories()), Error);
}

TEST(TraceDataset, ReplaysTimesLengthsAndSharedBlocks) {
  const std::string path = testing::temp_file("trace.jsonl",
                                     "{\"timestamp\": 1000, \"input_length\": 40, \"output_length\": 5, \"hash_ids\": [1, 2]}\n"
                                     "\n"
                                     "{\"timestamp\": 1500, \"input_length\": 30, \"output_length\": 7, \"hash_ids\": [1]}\n"
                                     "{\"timestamp\": 3000, \"input_length\": 12, \"output_length\": 3}\n");
  DatasetOptions o;
  o.name = "trace";
  o.path = path;
  o.num_prompts = 100;
  o.trace_block_size = 16;
  o.trace_time_scale = 0.5;
  const Workload w = load_workload(o, stories());
  ASSERT_EQ(w.requests.size(), 3u);
  EXPECT_TRUE(w.timed);
  EXPECT_DOUBLE_EQ(*w.requests[0].arrival_s, 0.0);
  EXPECT_DOUBLE_EQ(*w.requests[1].arrival_s, 0.25);
  EXPECT_DOUBLE_EQ(*w.requests[2].arrival_s, 1.0);
  EXPECT_EQ(w.requests[0].prompt_len, 40);
  EXPECT_EQ(w.requests[1].prompt_len, 30);
  EXPECT_EQ(w.requests[2].prompt_len, 12);
  EXPECT_EQ(w.requests[1].output_len, 7);
  // Requests 0 and 1 share hash id 1 (16 tokens): their prompts start with the same text.
  const auto a = stories().encode(w.requests[0].prompt, true, false);
  const auto b = stories().encode(w.requests[1].prompt, true, false);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 12, b.begin()));
  o.num_prompts = 2;
  EXPECT_EQ(load_workload(o, stories()).requests.size(), 2u);
}

TEST(TraceDataset, ErrorsNameTheFileAndLine) {
  DatasetOptions o;
  o.name = "trace";
  o.path = testing::temp_file("bad.jsonl", "{\"timestamp\": 1, \"input_length\": 4, \"output_length\": 2}\n{\"timestamp\": 2}\n");
  try {
    load_workload(o, stories());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find(o.path + ":2"), std::string::npos) << e.what();
  }
  o.path = "/nonexistent/trace.jsonl";
  try {
    load_workload(o, stories());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find(o.path), std::string::npos);
  }
}

TEST(PrefixDataset, GroupsShareTheirSystemPrompt) {
  DatasetOptions o;
  o.name = "prefix";
  o.num_prompts = 12;
  o.prefix_num_groups = 3;
  o.prefix_system_prompt_len = 20;
  o.prefix_question_len = 6;
  o.prefix_output_len = 9;
  const Workload w = load_workload(o, stories());
  ASSERT_EQ(w.requests.size(), 12u);
  std::set<std::string> systems;
  for (const SampleRequest& r : w.requests) {
    systems.insert(r.prompt.substr(0, r.prompt.find("\n\n")));
    EXPECT_EQ(r.output_len, 9);
  }
  EXPECT_EQ(systems.size(), 3u);
  EXPECT_EQ(load_workload(o, stories()).requests[5].prompt, w.requests[5].prompt);
}

TEST(Datasets, UnknownNameIsAUsageError) {
  DatasetOptions o;
  o.name = "sonnet";
  try {
    load_workload(o, stories());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  }
}

}  // namespace
}  // namespace servetune::datasets
