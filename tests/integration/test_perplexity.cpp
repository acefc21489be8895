// Perplexity as llama-perplexity computes it (tests/data/perplexity: its results on the same text, from
// scripts/gen_perplexity_goldens.sh): stories260K within 0.5%, SmolLM2 Q4_1 within 0.5% (0.1% measured); the
// windowing and its errors; KL of a run against itself 0 and growing f32 -> f16 -> FP8 KV cache; a base file of another
// run shape refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "loadgen/perplexity.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"
#include "test_paths.h"

namespace servetune {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

EngineConfig config_for(const std::string& model, KvCacheDtype kv = KvCacheDtype::kAuto) {
  EngineConfig c;
  c.model = model;
  c.threads = 2;
  c.max_total_tokens = 2048;
  c.kv_cache_dtype = kv;
  return c;
}

loadgen::PerplexityResult run(const std::string& model, int ctx, int chunks, KvCacheDtype kv = KvCacheDtype::kAuto,
                              const std::string& save = "", const std::string& base = "") {
  Engine engine(config_for(model, kv));
  const auto tokens = engine.tokenizer().encode(read_text(testing::data_path("perplexity/text.txt")), true);
  loadgen::PerplexityOptions o;
  o.ctx = ctx;
  o.chunks = chunks;
  o.save_logprobs = save;
  o.kl_base = base;
  return loadgen::measure_perplexity(engine, tokens, o);
}

TEST(Perplexity, MatchesLlamaPerplexity) {
  const auto golden = nlohmann::json::parse(read_text(testing::data_path("perplexity/llama_perplexity.json")));
  for (const auto& g : golden["runs"]) {
    const std::string name = g["model"].get<std::string>();
    const std::string model = name.starts_with("models/") ? testing::smollm2_path() : testing::data_path(name.substr(11));
    const auto r = run(model, g["ctx"].get<int>(), g["chunks"].get<int>());
    const double want = g["ppl"].get<double>();
    EXPECT_NEAR(r.ppl / want, 1.0, 0.005) << name << ": " << r.ppl << " vs llama-perplexity " << want;
    EXPECT_NEAR(r.ppl_error / g["ppl_error"].get<double>(), 1.0, 0.01) << name;
    EXPECT_EQ(r.running_ppl.size(), static_cast<size_t>(r.chunks));
    EXPECT_EQ(r.scored, static_cast<int64_t>(r.chunks) * (r.ctx - 1 - r.ctx / 2));
  }
}

TEST(Perplexity, WindowingFollowsLlamaPerplexity) {
  std::vector<int32_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i + 10);
  const auto chunks = loadgen::perplexity_chunks(tokens, 32, -1, 1);
  ASSERT_EQ(chunks.size(), 3u);  // floor(100 / 32); the last 4 tokens are not used
  EXPECT_EQ(chunks[1][0], 1);    // each chunk starts with BOS in place of its first token
  EXPECT_EQ(chunks[1][1], 43);
  EXPECT_EQ(loadgen::perplexity_chunks(tokens, 32, 2, -1).size(), 2u);
  EXPECT_EQ(loadgen::perplexity_chunks(tokens, 32, 2, -1)[1][0], 42);  // no BOS: the text's own token
  try {
    loadgen::perplexity_chunks(tokens, 64, -1, 1);
    ADD_FAILURE() << "100 tokens cannot fill two chunks of 64";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("needs at least 128 tokens of text; this text has 100"), std::string::npos) << e.what();
  }
}

TEST(Perplexity, KlAgainstABaseRun) {
  const auto dir = std::filesystem::temp_directory_path() / ("servetune_ppl_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string base = (dir / "f32.logprobs").string();
  const std::string model = testing::smollm2_path();
  const auto f32 = run(model, 128, 4, KvCacheDtype::kF32, base);
  const auto self = run(model, 128, 4, KvCacheDtype::kF32, "", base);
  ASSERT_TRUE(self.kl);
  EXPECT_EQ(self.kl->mean, 0.0);
  EXPECT_EQ(self.kl->top1_agreement, 1.0);
  EXPECT_NEAR(self.kl->base_ppl / f32.ppl, 1.0, 1e-6);  // the file holds f32 log-probabilities
  const auto f16 = run(model, 128, 4, KvCacheDtype::kF16, "", base);
  const auto fp8 = run(model, 128, 4, KvCacheDtype::kFp8E4m3, "", base);
  ASSERT_TRUE(f16.kl && fp8.kl);
  EXPECT_GT(f16.kl->mean, 0.0);
  EXPECT_GT(fp8.kl->mean, f16.kl->mean);
  EXPECT_GE(f16.kl->p99, f16.kl->median);
  EXPECT_LE(fp8.kl->top1_agreement, f16.kl->top1_agreement);
  EXPECT_NEAR(f16.kl->delta_ppl, f16.ppl - f32.ppl, 1e-5);
  // Another ctx scores other positions: refused, naming the file.
  try {
    run(model, 64, 4, KvCacheDtype::kF32, "", base);
    ADD_FAILURE() << "a base of another ctx was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find(base + ": the base ran ctx 128"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace servetune
