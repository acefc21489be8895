// `servetune generate` as a user runs it: --warmup runs the prompt untimed first and forgets it from the prefix
// cache, so the timed output is the same and the timed prefill computes the whole prompt again.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "test_paths.h"
#ifdef SERVETUNE_BIN  // the servetune binary is built alongside
#include "tuner/tuner_cli.h"

namespace servetune {
namespace {

nlohmann::json last_json(const std::string& output) { return nlohmann::json::parse(output.substr(output.rfind("\n{") + 1)); }

TEST(GenerateCli, WarmupKeepsTheOutputAndTimesTheWholePrompt) {
  // A prompt of several 16-token pages, so a warm-up that stayed cached would serve most of it.
  const std::string prompt = "'Once upon a time there was a little girl who liked to play in the park with her dog. "
                             "One day the dog ran away and the girl looked for him everywhere until the sun went down.'";
  const std::string common = "generate -m " + testing::stories_path() + " --prompt " + prompt + " --max-tokens 24 --threads 2";
  const auto plain = testing::servetune(common + " --json");
  const auto warm = testing::servetune(common + " --json --warmup 2");
  ASSERT_EQ(plain.code, 0) << plain.output;
  ASSERT_EQ(warm.code, 0) << warm.output;
  EXPECT_EQ(last_json(warm.output)["output_ids"], last_json(plain.output)["output_ids"]);
  EXPECT_EQ(last_json(plain.output)["output_ids"].size(), 24u);
  EXPECT_GT(last_json(plain.output)["prompt_ids"].size(), 32u);
  const auto timed = testing::servetune(common + " --warmup 1");
  ASSERT_EQ(timed.code, 0) << timed.output;
  EXPECT_NE(timed.output.find("tok/s), 0 from the prefix cache"), std::string::npos) << timed.output;
  const auto bad = testing::servetune(common + " --warmup -1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--warmup"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace servetune
#endif
