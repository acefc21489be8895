// The mixture-of-experts and latent-attention families against HF transformers: logits of random-weight f32
// Qwen3-MoE, Mixtral, DeepSeek-V3 and DeepSeek-V2 models (made by scripts/gen_moe_goldens.py with transformers
// itself) match to 1e-4 relative, in one pass, in two chunks, and one token at a time through the paged cache; and the
// routing unit picks the experts transformers picked on the first MoE layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/kv_storage.h"
#include "formats/safetensors.h"
#include "backend/moe_routing.h"
#include "servetune/model_info.h"
#include "model_batches.h"
#include "test_paths.h"

namespace servetune {
namespace {

using testing::expect_rows_close;
using testing::one_sequence;

const nlohmann::json& goldens() {
  static const nlohmann::json doc = [] {
    std::ifstream in(testing::data_path("hf_models/moe_logits.json"));
    return nlohmann::json::parse(in);
  }();
  return doc;
}

struct Case {
  std::string model;
  bool fused;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << (c.fused ? " (compile fused)" : ""); }

class MoeParity : public ::testing::TestWithParam<Case> {};

TEST_P(MoeParity, LogitsMatchTransformers) {
  const Case& p = GetParam();
  Checkpoint ck(testing::data_path("hf_models/" + p.model), LoadFormat::kSafetensors);
  auto backend = make_backend("cpu", 2);
  CompileOptions compile;
  compile.fused = p.fused;
  auto model = ck.load(*backend, ParallelContext{}, compile);
  const int64_t page = 4, blocks = 8;
  for (const auto& c : goldens().at("models").at(p.model)) {
    const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
    const auto expected = c.at("logits").get<std::vector<std::vector<float>>>();
    const int n = static_cast<int>(tokens.size());
    std::vector<float> logits;
    {
      KvStorage kv(*backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
      const ExpertLoad before = model->expert_load();
      model->forward(one_sequence(tokens, 0, n, page, blocks), kv, logits);
      expect_rows_close(logits, expected, 0, p.model + " one pass");
      // Every token of every MoE layer went to top_k experts; the busiest expert of a layer had between the mean
      // and all of the tokens.
      const MoeConfig& moe = model->config().moe;
      const auto moe_layers = std::count(moe.moe_layer.begin(), moe.moe_layer.end(), true);
      const ExpertLoad after = model->expert_load();
      EXPECT_EQ(after.experts, moe.routing.n_experts);
      EXPECT_EQ(after.routed - before.routed, n * moe.routing.top_k * moe_layers);
      EXPECT_GE((after.busiest - before.busiest) * moe.routing.n_experts, (after.routed - before.routed));
      EXPECT_LE(after.busiest - before.busiest, n * moe_layers);
    }
    if (n > 1) {
      KvStorage kv(*backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
      const int half = n / 2;
      model->forward(one_sequence(tokens, 0, half, page, blocks), kv, logits);
      model->forward(one_sequence(tokens, half, n, page, blocks), kv, logits);
      expect_rows_close(logits, expected, static_cast<size_t>(half), p.model + " second chunk");
      KvStorage decode_kv(*backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
      for (int t = 0; t < n; ++t) {
        model->forward(one_sequence(tokens, t, t + 1, page, blocks), decode_kv, logits);
        expect_rows_close(logits, expected, static_cast<size_t>(t), p.model + " token by token");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MoeParity,
                         ::testing::Values(Case{"qwen3_moe_tiny", false}, Case{"mixtral_tiny", false},
                                           Case{"deepseek_v3_tiny", false}, Case{"deepseek_v2_lite_tiny", false},
                                           Case{"deepseek_v2_group_tiny", false}, Case{"deepseek_v3_tiny", true},
                                           Case{"qwen3_moe_tiny", true}, Case{"deepseek_v3_tiny_fp8", false},
                                           Case{"deepseek_v3_small_fp8", false}),
                         [](const ::testing::TestParamInfo<Case>& param) {
                           return param.param.model + (param.param.fused ? "_fused" : "");
                         });

// The routing unit, fed transformers' router logits of the first MoE layer, picks the same experts with the same
// weights (transformers lists each token's experts by descending weight).
TEST(MoeParity, RoutingMatchesTransformers) {
  for (const auto& [name, golden] : goldens().at("routing").items()) {
    Checkpoint ck(testing::data_path("hf_models/" + name), LoadFormat::kSafetensors);
    const MoeRouting& routing = ck.config().moe.routing;
    const auto logits = golden.at("router_logits").get<std::vector<std::vector<float>>>();
    const auto ids = golden.at("expert_ids").get<std::vector<std::vector<int32_t>>>();
    const auto weights = golden.at("expert_weights").get<std::vector<std::vector<float>>>();
    // DeepSeek-V3's selection bias, straight from the checkpoint file.
    std::vector<float> bias;
    if (ck.config().moe.selection_bias) {
      const SafetensorsSet file(testing::data_path("hf_models/" + name + "/model.safetensors"));
      const std::string tensor = "model.layers." + std::to_string(golden.at("layer").get<int>()) + ".mlp.gate.e_score_correction_bias";
      const SafetensorsTensor* t = file.tensor(tensor);
      ASSERT_NE(t, nullptr) << tensor;
      bias.resize(static_cast<size_t>(t->n_elements()));
      std::memcpy(bias.data(), t->data.data(), bias.size() * sizeof(float));
    }
    const float* bias_ptr = bias.empty() ? nullptr : bias.data();
    for (size_t t = 0; t < logits.size(); ++t) {
      const auto k = static_cast<size_t>(routing.top_k);
      std::vector<int32_t> got_ids(k);
      std::vector<float> got_weights(k);
      route_tokens(routing, logits[t].data(), bias_ptr, 1, got_ids.data(), got_weights.data());
      std::vector<std::pair<float, int32_t>> ours, theirs;
      for (size_t i = 0; i < k; ++i) {
        ours.emplace_back(-got_weights[i], got_ids[i]);
        theirs.emplace_back(-weights[t][i], ids[t][i]);
      }
      std::sort(ours.begin(), ours.end());
      std::sort(theirs.begin(), theirs.end());
      for (size_t i = 0; i < k; ++i) {
        EXPECT_EQ(ours[i].second, theirs[i].second) << name << " token " << t;
        EXPECT_NEAR(ours[i].first, theirs[i].first, 1e-5f) << name << " token " << t;
      }
    }
  }
}

}  // namespace
}  // namespace servetune

namespace servetune {
namespace {

// A DeepSeek-V3 tiny checkpoint without one routed expert's matrix fails to load with the tensor named as the file
// names it.
TEST(MoeParity, AMissingExpertTensorIsNamed) {
  namespace fs = std::filesystem;
  const fs::path src = testing::data_path("hf_models/deepseek_v3_tiny");
  const fs::path dir = fs::temp_directory_path() / ("servetune_missing_expert_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(src / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  fs::copy_file(src / "tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  const std::string dropped = "model.layers.2.mlp.experts.5.up_proj.weight";
  {
    const SafetensorsSet file((src / "model.safetensors").string());
    std::vector<SafetensorsWriteTensor> kept;
    for (const std::string& name : file.names()) {
      const SafetensorsTensor* t = file.tensor(name);
      if (name != dropped) kept.push_back({name, t->dtype, t->shape, t->data});
    }
    write_safetensors((dir / "model.safetensors").string(), kept, {{"format", "pt"}});
  }
  Checkpoint ck(dir.string(), LoadFormat::kSafetensors);
  auto backend = make_backend("cpu", 1);
  try {
    ck.load(*backend, ParallelContext{});
    ADD_FAILURE() << "loaded without " << dropped;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("missing tensor '" + dropped + "'"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace servetune

namespace servetune {
namespace {

// The published DeepSeek-V3 config as dummy weights: its size from the config alone (685 B bf16 parameters with the
// MTP layer; 61 layers x 576 latent values of KV per token), and a clear refusal where it cannot fit.
TEST(MoeParity, DummyWeightsOfARealConfigSayWhatTheyNeed) {
  const std::string path = testing::source_path("configs/models/deepseek-v3");
  const ModelInfo info = read_model_info(path, LoadFormat::kDummy);
  EXPECT_GT(info.weight_bytes, int64_t{2} * 684'000'000'000);
  EXPECT_LT(info.weight_bytes, int64_t{2} * 686'000'000'000);
  EXPECT_EQ(info.kv_values_per_token, 61 * 576);
  EXPECT_EQ(info.experts, 256);
  Checkpoint ck(path, LoadFormat::kDummy);
  auto backend = make_backend("cpu", 1);
  try {
    ck.load(*backend, ParallelContext{});
    ADD_FAILURE() << "1.2 TiB of random weights loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("random weights of this config take 1.2 TiB"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("68.6 KiB per token"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune

namespace servetune {
namespace {

// The FP8 block-scaled checkpoint against the model it was quantized from (deepseek_v3_tiny): the same greedy token
// at every position of every golden sequence, and logits within the error FP8 implies. E4M3 keeps 3 mantissa bits,
// so each weight is off by up to 2^-4 of itself (half a step, after its block's scale); through 3 layers of these
// random weights that moves the logits by up to 21% of the largest (measured on the transformers goldens); the test
// allows 25%. Exactness against the dequantized model is the LogitsMatchTransformers case above.
TEST(MoeParity, Fp8CheckpointKeepsTheGreedyTokensOfItsSource) {
  Checkpoint ck(testing::data_path("hf_models/deepseek_v3_tiny_fp8"), LoadFormat::kSafetensors);
  auto backend = make_backend("cpu", 2);
  auto model = ck.load(*backend, ParallelContext{});
  const auto& source = goldens().at("models").at("deepseek_v3_tiny");
  const int64_t page = 4, blocks = 8;
  for (const auto& c : source) {
    const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
    const auto expected = c.at("logits").get<std::vector<std::vector<float>>>();
    const auto argmax = c.at("argmax").get<std::vector<int32_t>>();
    const int n = static_cast<int>(tokens.size());
    KvStorage kv(*backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
    std::vector<float> logits;
    model->forward(one_sequence(tokens, 0, n, page, blocks), kv, logits);
    const size_t vocab = expected[0].size();
    for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
      const auto row = logits.begin() + static_cast<std::ptrdiff_t>(r * vocab);
      EXPECT_EQ(std::max_element(row, row + static_cast<std::ptrdiff_t>(vocab)) - row, argmax[r]) << "position " << r;
      float scale = 0.0f, worst = 0.0f;
      for (size_t i = 0; i < vocab; ++i) {
        scale = std::max(scale, std::fabs(expected[r][i]));
        worst = std::max(worst, std::fabs(row[static_cast<std::ptrdiff_t>(i)] - expected[r][i]));
      }
      EXPECT_LE(worst, 0.25f * scale) << "position " << r;
    }
  }
}

}  // namespace
}  // namespace servetune
