// make-model's mixture-of-experts / latent-attention presets and the committed published configs they shrink
// (configs/models/<name>/config.json, issue #37): every preset's checkpoint loads through Checkpoint from safetensors
// and runs a forward whose logits are finite and the same in one pass, in two chunks and token by token through the
// paged cache; it keeps its family's structure (routing, MLA, dense first layers, DeepSeek-V3's MTP layer on disk); and
// every published config parses to the published expert counts and latent-attention dimensions.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "model/checkpoint.h"
#include "model/hf_weights.h"
#include "model/kv_storage.h"
#include "model/make_model.h"
#include "model/random_weights.h"
#include "model_batches.h"
#include "servetune/tokenizer.h"
#include "test_paths.h"

namespace servetune {
namespace {

namespace fs = std::filesystem;
using testing::one_sequence;

const char* const kMoePresets[] = {"deepseek-v3-tiny", "deepseek-v2-lite-tiny", "qwen3-moe-tiny", "mixtral-tiny"};

class PresetDir {
 public:
  explicit PresetDir(const std::string& preset)
      : dir_(fs::temp_directory_path() / ("servetune_preset_" + preset + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    make_random_model(preset, dir_.string(), 5, WeightDType::kF32, 0.02f);
  }
  ~PresetDir() { fs::remove_all(dir_); }
  PresetDir(const PresetDir&) = delete;
  PresetDir& operator=(const PresetDir&) = delete;
  std::string path() const { return dir_.string(); }

 private:
  fs::path dir_;
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, size_t offset,
                  const std::string& what) {
  float scale = 0.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[offset + i], 1e-4f * scale + 1e-6f) << what << " value " << offset + i;
  }
}

class Preset : public ::testing::TestWithParam<const char*> {};

TEST_P(Preset, LoadsFromSafetensorsAndRunsAForward) {
  const std::string name = GetParam();
  const PresetDir dir(name);
  // A few MB in f32.
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) bytes += static_cast<int64_t>(e.file_size());
  EXPECT_LT(bytes, int64_t{4} << 20) << name;
  // The config.json written reads back to the preset (but for torch_dtype, which the writer sets).
  HfModelConfig written = read_hf_config(dir.path());
  HfModelConfig preset = model_preset(name);
  preset.torch_dtype = written.torch_dtype;
  EXPECT_EQ(written, preset) << name;

  Checkpoint ck(dir.path(), LoadFormat::kSafetensors);
  const ModelConfig& c = ck.config();
  ASSERT_GT(c.moe.routing.n_experts, 0) << name;
  auto backend = make_backend("cpu", 2);
  auto model = ck.load(*backend, ParallelContext{}, CompileOptions{});
  const auto tokenizer = ck.load_tokenizer();
  std::vector<int32_t> tokens = tokenizer->encode("Mixture of experts, latent attention.");
  ASSERT_GE(tokens.size(), 8u);
  tokens.resize(8);
  const int n = static_cast<int>(tokens.size());
  const int64_t page = 4, blocks = 4;
  const auto vocab = static_cast<size_t>(c.vocab);

  std::vector<float> all, logits;
  {
    KvStorage kv(*backend, c, model->local_kv_heads(), blocks, page, DType::kF32);
    model->forward(one_sequence(tokens, 0, n, page, blocks), kv, all);
  }
  ASSERT_EQ(all.size(), static_cast<size_t>(n) * vocab) << name;
  float spread = 0.0f;
  for (float v : all) {
    ASSERT_TRUE(std::isfinite(v)) << name;
    spread = std::max(spread, std::fabs(v - all[0]));
  }
  EXPECT_GT(spread, 0.0f) << name << ": constant logits";
  {
    KvStorage kv(*backend, c, model->local_kv_heads(), blocks, page, DType::kF32);
    model->forward(one_sequence(tokens, 0, n / 2, page, blocks), kv, logits);
    model->forward(one_sequence(tokens, n / 2, n, page, blocks), kv, logits);
    expect_close(logits, all, static_cast<size_t>(n / 2) * vocab, name + " second chunk");
  }
  {
    KvStorage kv(*backend, c, model->local_kv_heads(), blocks, page, DType::kF32);
    for (int t = 0; t < n; ++t) {
      model->forward(one_sequence(tokens, t, t + 1, page, blocks), kv, logits);
      expect_close(logits, all, static_cast<size_t>(t) * vocab, name + " token " + std::to_string(t));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MoePresets, Preset, ::testing::ValuesIn(kMoePresets),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string s = p.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// Each preset keeps its family's structure, as the engine reads it.
TEST(Preset, KeepsTheFamilyStructure) {
  {
    const ModelConfig c = model_config_from_hf(model_preset("deepseek-v3-tiny"), "deepseek-v3-tiny");
    EXPECT_EQ(c.architecture, "deepseek_v3");
    EXPECT_EQ(c.n_layers, 4);
    EXPECT_EQ(c.moe.moe_layer, (std::vector<bool>{false, true, true, true}));
    EXPECT_EQ(c.moe.routing.n_experts, 16);
    EXPECT_EQ(c.moe.routing.top_k, 4);
    EXPECT_EQ(c.moe.routing.n_group, 4);
    EXPECT_EQ(c.moe.routing.topk_group, 2);
    EXPECT_EQ(c.moe.routing.scoring, MoeScoring::kSigmoid);
    EXPECT_EQ(c.moe.routing.group_score, MoeGroupScore::kTopTwoSum);
    EXPECT_TRUE(c.moe.routing.renormalize);
    EXPECT_FLOAT_EQ(c.moe.routing.scaling, 2.5f);
    EXPECT_TRUE(c.moe.selection_bias);
    EXPECT_EQ(c.moe.shared_ffn, c.moe.expert_ffn);  // one shared expert
    EXPECT_GT(c.mla.q_lora_rank, 0);
    EXPECT_EQ(c.rope_scaling, RopeKind::kYarn);
    EXPECT_FLOAT_EQ(c.attention_scale_factor,
                    static_cast<float>(std::pow(0.1 * std::log(40.0) + 1.0, 2)));  // mscale_all_dim 1
    EXPECT_EQ(model_preset("deepseek-v3-tiny").num_nextn_predict_layers, 1);
  }
  {
    const ModelConfig c = model_config_from_hf(model_preset("deepseek-v2-lite-tiny"), "deepseek-v2-lite-tiny");
    EXPECT_EQ(c.architecture, "deepseek_v2");
    EXPECT_EQ(c.moe.moe_layer, (std::vector<bool>{false, true, true, true}));
    EXPECT_EQ(c.mla.q_lora_rank, 0);
    EXPECT_EQ(c.moe.routing.top_k, 6);
    EXPECT_EQ(c.moe.routing.n_group, 1);
    EXPECT_EQ(c.moe.routing.scoring, MoeScoring::kSoftmax);
    EXPECT_FALSE(c.moe.routing.renormalize);
    EXPECT_FALSE(c.moe.selection_bias);
    EXPECT_EQ(c.moe.shared_ffn, 2 * c.moe.expert_ffn);  // two shared experts
    EXPECT_EQ(c.rope_scaling, RopeKind::kYarn);
  }
  {
    const ModelConfig c = model_config_from_hf(model_preset("qwen3-moe-tiny"), "qwen3-moe-tiny");
    EXPECT_EQ(c.architecture, "qwen3_moe");
    EXPECT_EQ(c.moe.moe_layer, std::vector<bool>(4, true));
    EXPECT_TRUE(c.qk_norm);
    EXPECT_TRUE(c.moe.routing.renormalize);
    EXPECT_EQ(c.moe.shared_ffn, 0);
    EXPECT_GT(c.n_heads * c.head_dim, c.hidden);  // explicit head_dim, as Qwen3-30B-A3B
    EXPECT_EQ(c.n_heads / c.n_kv_heads, 8);
  }
  {
    const ModelConfig c = model_config_from_hf(model_preset("mixtral-tiny"), "mixtral-tiny");
    EXPECT_EQ(c.architecture, "mixtral");
    EXPECT_EQ(c.moe.moe_layer, std::vector<bool>(4, true));
    EXPECT_EQ(c.moe.routing.n_experts, 8);
    EXPECT_EQ(c.moe.routing.top_k, 2);
    EXPECT_TRUE(c.moe.routing.renormalize);
  }
}

// DeepSeek-V3's checkpoint carries the multi-token-prediction layer after the decoder's, named as DeepSeek stores it
// (model.layers.61.* there): a full MoE decoder layer plus embed_tokens, enorm, hnorm, eh_proj and shared_head.
TEST(Preset, DeepSeekV3CarriesTheMtpLayer) {
  const PresetDir dir("deepseek-v3-tiny");
  const SafetensorsSet file(dir.path() + "/model.safetensors");
  const HfModelConfig hf = model_preset("deepseek-v3-tiny");
  const int64_t d = hf.hidden_size, v = hf.vocab_size;
  const std::string mtp = "model.layers." + std::to_string(hf.num_hidden_layers) + ".";
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"embed_tokens.weight", {v, d}},
      {"enorm.weight", {d}},
      {"hnorm.weight", {d}},
      {"eh_proj.weight", {d, 2 * d}},
      {"shared_head.norm.weight", {d}},
      {"shared_head.head.weight", {v, d}},
      {"input_layernorm.weight", {d}},
      {"self_attn.q_a_proj.weight", {hf.mla.q_lora_rank, d}},
      {"self_attn.kv_b_proj.weight",
       {hf.num_attention_heads * (hf.mla.qk_nope_head_dim + hf.mla.v_head_dim), hf.mla.kv_lora_rank}},
      {"mlp.gate.weight", {hf.moe.num_experts, d}},
      {"mlp.gate.e_score_correction_bias", {hf.moe.num_experts}},
      {"mlp.experts.15.down_proj.weight", {d, hf.moe.moe_intermediate_size}},
      {"mlp.shared_experts.up_proj.weight", {hf.moe.moe_intermediate_size, d}},
  };
  for (const auto& [name, shape] : expected) {
    const SafetensorsTensor* t = file.tensor(mtp + name);
    ASSERT_NE(t, nullptr) << mtp + name;
    EXPECT_EQ(t->shape, shape) << mtp + name;
  }
  EXPECT_EQ(file.tensor("model.layers." + std::to_string(hf.num_hidden_layers + 1) + ".enorm.weight"), nullptr);
  // Only the MTP layer is extra: without it the specs are the decoder's alone.
  HfModelConfig no_mtp = hf;
  no_mtp.num_nextn_predict_layers = 0;
  for (const auto& spec : hf_tensor_specs(no_mtp)) {
    EXPECT_EQ(spec.hf_name.rfind(mtp, 0), std::string::npos) << spec.hf_name;
  }
}

// The published configs the presets shrink parse, and the engine reads the published expert counts and dimensions.
struct Published {
  const char* dir;
  const char* architecture;
  int64_t layers, hidden, experts, top_k, expert_ffn, shared_ffn, dense_layers;
};

class PublishedConfig : public ::testing::TestWithParam<Published> {};

TEST_P(PublishedConfig, Parses) {
  const Published& p = GetParam();
  const std::string path = testing::source_path(std::string("configs/models/") + p.dir + "/config.json");
  const HfModelConfig hf = read_hf_config(path);
  EXPECT_EQ(hf.architecture, p.architecture);
  const ModelConfig c = model_config_from_hf(hf, path);
  EXPECT_EQ(c.n_layers, p.layers);
  EXPECT_EQ(c.hidden, p.hidden);
  EXPECT_EQ(c.moe.routing.n_experts, p.experts);
  EXPECT_EQ(c.moe.routing.top_k, p.top_k);
  EXPECT_EQ(c.moe.expert_ffn, p.expert_ffn);
  EXPECT_EQ(c.moe.shared_ffn, p.shared_ffn);
  ASSERT_EQ(c.moe.moe_layer.size(), static_cast<size_t>(p.layers));
  EXPECT_EQ(std::count(c.moe.moe_layer.begin(), c.moe.moe_layer.end(), false), p.dense_layers);
  for (int64_t l = 0; l < p.dense_layers; ++l) EXPECT_FALSE(c.moe.moe_layer[static_cast<size_t>(l)]) << l;
}

INSTANTIATE_TEST_SUITE_P(
    Models, PublishedConfig,
    ::testing::Values(Published{"deepseek-v3", "DeepseekV3ForCausalLM", 61, 7168, 256, 8, 2048, 2048, 3},
                      Published{"deepseek-v2-lite", "DeepseekV2ForCausalLM", 27, 2048, 64, 6, 1408, 2816, 1},
                      Published{"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 48, 2048, 128, 8, 768, 0, 0},
                      Published{"mixtral-8x7b-v0.1", "MixtralForCausalLM", 32, 4096, 8, 2, 14336, 0, 0}),
    [](const ::testing::TestParamInfo<Published>& p) {
      std::string s = p.param.dir;
      for (char& ch : s) {
        if (ch == '-' || ch == '.') ch = '_';
      }
      return s;
    });

// The rest of what decides each family: routing, latent attention, rope, MTP.
TEST(PublishedConfig, DeepSeekV3) {
  const HfModelConfig hf = read_hf_config(testing::source_path("configs/models/deepseek-v3/config.json"));
  EXPECT_EQ(hf.mla, (HfMlaConfig{1536, 512, 128, 64, 128}));
  EXPECT_EQ(hf.num_attention_heads, 128);
  EXPECT_EQ(hf.vocab_size, 129280);
  EXPECT_EQ(hf.num_nextn_predict_layers, 1);
  EXPECT_EQ(hf.moe.n_group, 8);
  EXPECT_EQ(hf.moe.topk_group, 4);
  EXPECT_EQ(hf.moe.topk_method, "noaux_tc");
  EXPECT_EQ(hf.moe.scoring_func, "sigmoid");
  EXPECT_TRUE(hf.moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(hf.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(hf.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_DOUBLE_EQ(hf.rope_scaling.factor, 40.0);
  EXPECT_EQ(hf.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(hf.rope_scaling.mscale, 1.0);
  EXPECT_DOUBLE_EQ(hf.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(hf.max_position_embeddings, 163840);
  EXPECT_EQ(hf.bos_token_id, std::vector<int64_t>{0});
  EXPECT_EQ(hf.eos_token_id, std::vector<int64_t>{1});
  const ModelConfig c = model_config_from_hf(hf, "deepseek-v3");
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.kv_values_per_head(), 512 + 64);
  EXPECT_EQ(c.moe.routing.n_group, 8);
  EXPECT_EQ(c.moe.routing.scoring, MoeScoring::kSigmoid);
  EXPECT_TRUE(c.moe.selection_bias);
  // The presets shrink widths and counts only: the same routing rule and structure flags.
  const HfModelConfig tiny = model_preset("deepseek-v3-tiny");
  EXPECT_EQ(tiny.moe.topk_method, hf.moe.topk_method);
  EXPECT_EQ(tiny.moe.scoring_func, hf.moe.scoring_func);
  EXPECT_EQ(tiny.moe.norm_topk_prob, hf.moe.norm_topk_prob);
  EXPECT_EQ(tiny.moe.routed_scaling_factor, hf.moe.routed_scaling_factor);
  EXPECT_EQ(tiny.moe.n_shared_experts, hf.moe.n_shared_experts);
  EXPECT_EQ(tiny.num_nextn_predict_layers, hf.num_nextn_predict_layers);
  EXPECT_EQ(tiny.rope_scaling.factor, hf.rope_scaling.factor);
  EXPECT_EQ(tiny.rope_scaling.mscale, hf.rope_scaling.mscale);
  EXPECT_EQ(tiny.rope_scaling.mscale_all_dim, hf.rope_scaling.mscale_all_dim);
}

TEST(PublishedConfig, DeepSeekV2Lite) {
  const HfModelConfig hf = read_hf_config(testing::source_path("configs/models/deepseek-v2-lite/config.json"));
  EXPECT_EQ(hf.mla, (HfMlaConfig{0, 512, 128, 64, 128}));  // q_lora_rank null: no query compression
  EXPECT_EQ(hf.num_attention_heads, 16);
  EXPECT_EQ(hf.moe.topk_method, "greedy");
  EXPECT_EQ(hf.moe.scoring_func, "softmax");
  EXPECT_FALSE(hf.moe.norm_topk_prob);
  EXPECT_EQ(hf.moe.n_shared_experts, 2);
  EXPECT_DOUBLE_EQ(hf.rope_scaling.mscale, 0.707);
  EXPECT_DOUBLE_EQ(hf.rope_scaling.mscale_all_dim, 0.707);
  const ModelConfig c = model_config_from_hf(hf, "deepseek-v2-lite");
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_EQ(c.moe.routing.n_group, 1);
  EXPECT_FALSE(c.moe.selection_bias);
  const HfModelConfig tiny = model_preset("deepseek-v2-lite-tiny");
  EXPECT_EQ(tiny.mla.q_lora_rank, 0);
  EXPECT_EQ(tiny.moe.topk_method, hf.moe.topk_method);
  EXPECT_EQ(tiny.moe.scoring_func, hf.moe.scoring_func);
  EXPECT_EQ(tiny.moe.norm_topk_prob, hf.moe.norm_topk_prob);
  EXPECT_EQ(tiny.moe.n_shared_experts, hf.moe.n_shared_experts);
  EXPECT_EQ(tiny.moe.num_experts_per_tok, hf.moe.num_experts_per_tok);
  EXPECT_EQ(tiny.rope_scaling.mscale, hf.rope_scaling.mscale);
}

TEST(PublishedConfig, Qwen3MoeAndMixtral) {
  const HfModelConfig qwen = read_hf_config(testing::source_path("configs/models/qwen3-30b-a3b/config.json"));
  EXPECT_EQ(qwen.head_dim, 128);
  EXPECT_EQ(qwen.num_attention_heads, 32);
  EXPECT_EQ(qwen.num_key_value_heads, 4);
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_TRUE(qwen.moe.norm_topk_prob);
  EXPECT_EQ(qwen.moe.decoder_sparse_step, 1);
  EXPECT_TRUE(qwen.moe.mlp_only_layers.empty());
  EXPECT_DOUBLE_EQ(qwen.rope_theta, 1e6);
  EXPECT_EQ(qwen.vocab_size, 151936);
  const HfModelConfig mixtral = read_hf_config(testing::source_path("configs/models/mixtral-8x7b-v0.1/config.json"));
  EXPECT_EQ(mixtral.num_key_value_heads, 8);
  EXPECT_FALSE(mixtral.sliding_window.has_value());
  EXPECT_DOUBLE_EQ(mixtral.rope_theta, 1e6);
  EXPECT_EQ(mixtral.vocab_size, 32000);
  EXPECT_EQ(model_preset("qwen3-moe-tiny").moe.norm_topk_prob, qwen.moe.norm_topk_prob);
  EXPECT_EQ(model_preset("qwen3-moe-tiny").num_attention_heads / model_preset("qwen3-moe-tiny").num_key_value_heads,
            qwen.num_attention_heads / qwen.num_key_value_heads);
  EXPECT_EQ(model_preset("mixtral-tiny").num_attention_heads / model_preset("mixtral-tiny").num_key_value_heads,
            mixtral.num_attention_heads / mixtral.num_key_value_heads);
}

}  // namespace
}  // namespace servetune
