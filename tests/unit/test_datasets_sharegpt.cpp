// ShareGPT sampling against tests/data/sharegpt_slice_expected.json, which scripts/gen_sharegpt_slice.py computes
// from the committed slice with vLLM's rules, llama-cpp-python's tokenizer and CPython's random.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "datasets/dataset.h"
#include "formats/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune::datasets {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void check_tokenizer(const std::string& name, const std::string& model_path) {
  GgufFile gguf(model_path);
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(gguf);
  const nlohmann::json slice = read_json(testing::data_path("sharegpt_slice.json"));
  const nlohmann::json expected = read_json(testing::data_path("sharegpt_slice_expected.json"))["tokenizers"][name];
  struct Case {
    const char* key;
    uint64_t seed;
    int64_t num_prompts;
    std::optional<int64_t> output_len;
    bool shuffle;
    bool oversample;
  };
  const Case cases[] = {{"seed0_all_no_oversample", 0, 1000, std::nullopt, true, false},
                        {"seed0_first10", 0, 10, std::nullopt, true, true},
                        {"seed7_oversample60", 7, 60, std::nullopt, true, true},
                        {"seed0_output_len_64", 0, 1000, 64, true, false},
                        {"no_shuffle_first10", 0, 10, std::nullopt, false, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(name + "/" + c.key);
    DatasetOptions o;
    o.name = "sharegpt";
    o.path = testing::data_path("sharegpt_slice.json");
    o.seed = c.seed;
    o.num_prompts = c.num_prompts;
    o.sharegpt_output_len = c.output_len;
    o.disable_shuffle = !c.shuffle;
    o.no_oversample = !c.oversample;
    const Workload w = load_workload(o, *tok);
    const nlohmann::json& e = expected[c.key];
    EXPECT_EQ(w.info["kept"].get<int64_t>(), e["kept"].get<int64_t>());
    ASSERT_EQ(w.requests.size(), e["requests"].size());
    int64_t prompt_total = 0, output_total = 0;
    for (size_t i = 0; i < w.requests.size(); ++i) {
      const nlohmann::json& r = e["requests"][i];
      EXPECT_EQ(w.requests[i].prompt, slice[r["index"].get<size_t>()]["conversations"][0]["value"].get<std::string>()) << i;
      EXPECT_EQ(w.requests[i].prompt_len, r["prompt_len"].get<int64_t>()) << i;
      EXPECT_EQ(w.requests[i].output_len, r["output_len"].get<int64_t>()) << i;
      prompt_total += w.requests[i].prompt_len;
      output_total += w.requests[i].output_len;
    }
    EXPECT_EQ(prompt_total, e["total_prompt_tokens"].get<int64_t>());
    EXPECT_EQ(output_total, e["total_output_tokens"].get<int64_t>());
  }
}

TEST(ShareGpt, SliceMatchesTheVllmReferenceStories260K) { check_tokenizer("stories260K", testing::stories_path()); }

TEST(ShareGpt, SliceMatchesTheVllmReferenceSmolLM2) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  check_tokenizer("smollm2", testing::smollm2_path());
}

TEST(ShareGpt, TruncatedFileKeepsCompleteEntriesOthersFail) {
  GgufFile gguf(testing::stories_path());
  const auto tok = Tokenizer::from_gguf(gguf);
  const std::string entry =
      R"({"id": "a", "conversations": [{"from": "human", "value": "Tell me a story about a cat please"},)"
      R"( {"from": "gpt", "value": "Once upon a time there was a cat who lived in a house"}]})";
  DatasetOptions o;
  o.name = "sharegpt";
  o.num_prompts = 4;
  o.path = testing::temp_file("truncated.json", "[" + entry + ", " + entry + ", {\"id\": \"b\", \"conversations\": [{\"from\": \"hu");
  const Workload w = load_workload(o, *tok);
  EXPECT_TRUE(w.info["truncated_file"].get<bool>());
  EXPECT_EQ(w.info["entries"].get<int64_t>(), 2);
  EXPECT_EQ(w.requests.size(), 4u);  // 2 kept, oversampled to 4

  o.path = testing::temp_file("broken.json", "[" + entry + ", } " + entry + "]");
  try {
    load_workload(o, *tok);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find(o.path), std::string::npos);
  }
  o.path = testing::temp_file("object.json", "{\"conversations\": []}");
  EXPECT_THROW(load_workload(o, *tok), Error);
  o.path = "/nonexistent/sharegpt.json";
  try {
    load_workload(o, *tok);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  }
  o.path = testing::temp_file("none_pass.json", R"([{"conversations": [{"value": "hi"}, {"value": "yo"}]}])");
  EXPECT_THROW(load_workload(o, *tok), Error);  // nothing passes the filters: nothing to oversample
}

}  // namespace
}  // namespace servetune::datasets
