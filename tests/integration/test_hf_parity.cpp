// The safetensors path against HF transformers: logits of random-weight f32 llama and qwen2 models (made by
// scripts/gen_hf_goldens.py with transformers itself) match to 1e-4 relative, in one pass and in two chunks
// through the paged KV cache.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/kv_storage.h"
#include "model_batches.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

using testing::expect_rows_close;
using testing::one_sequence;

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsMatchTransformers) {
  std::ifstream in(testing::data_path("hf_models/logits.json"));
  const auto doc = nlohmann::json::parse(in);
  const std::string dir = testing::data_path("hf_models/" + GetParam());
  Checkpoint ck(dir, LoadFormat::kSafetensors);
  auto backend = make_backend("cpu", 2);
  auto model = ck.load(*backend, ParallelContext{});
  EXPECT_EQ(model->config().tied_embeddings, GetParam() == "qwen2_tiny");
  const int64_t page = 4, blocks = 8;
  for (const auto& c : doc.at("models").at(GetParam())) {
    const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
    const auto expected = c.at("logits").get<std::vector<std::vector<float>>>();
    const int n = static_cast<int>(tokens.size());
    std::vector<float> logits;
    {
      KvStorage kv(*backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
      model->forward(one_sequence(tokens, 0, n, page, blocks), kv, logits);
      expect_rows_close(logits, expected, 0, GetParam() + " one pass");
    }
    if (n > 1) {
      KvStorage kv(*backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
      const int half = n / 2;
      model->forward(one_sequence(tokens, 0, half, page, blocks), kv, logits);
      model->forward(one_sequence(tokens, half, n, page, blocks), kv, logits);
      expect_rows_close(logits, expected, static_cast<size_t>(half), GetParam() + " second chunk");
    }
  }
  // The checkpoint's tokenizer.json loads too.
  auto tok = ck.load_tokenizer();
  EXPECT_EQ(tok->decode(tok->encode("hi there", false)), "hi there");
}

INSTANTIATE_TEST_SUITE_P(Models, HfParity, ::testing::Values("llama_tiny", "qwen2_tiny"));

}  // namespace
}  // namespace servetune
