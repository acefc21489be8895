// HF config.json: every fixture in tests/data/hf_config read as transformers reads it (<name>.expected.json,
// made by scripts/gen_format_goldens.py), writer output stable and readable by transformers, and bad configs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/hf_config.h"
#include "test_paths.h"

namespace servetune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string rope_type_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "?";
}

void expect_matches(const HfModelConfig& c, const json& w) {
  EXPECT_EQ(c.architecture, w["architecture"].get<std::string>());
  EXPECT_EQ(c.model_type, w["model_type"].get<std::string>());
  EXPECT_EQ(c.hidden_size, w["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.intermediate_size, w["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.num_hidden_layers, w["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(c.num_attention_heads, w["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(c.num_key_value_heads, w["num_key_value_heads"].get<int64_t>());
  EXPECT_EQ(c.head_dim, w["head_dim"].get<int64_t>());
  EXPECT_EQ(c.vocab_size, w["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.max_position_embeddings, w["max_position_embeddings"].get<int64_t>());
  EXPECT_EQ(c.rms_norm_eps, w["rms_norm_eps"].get<double>());
  EXPECT_EQ(c.rope_theta, w["rope_theta"].get<double>());
  EXPECT_EQ(rope_type_name(c.rope_scaling.type), w["rope_type"].get<std::string>());
  EXPECT_EQ(c.rope_scaling.factor, w["rope_factor"].get<double>());
  EXPECT_EQ(c.rope_scaling.low_freq_factor, w["rope_low_freq_factor"].get<double>());
  EXPECT_EQ(c.rope_scaling.high_freq_factor, w["rope_high_freq_factor"].get<double>());
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, w["rope_original_max_position_embeddings"].get<int64_t>());
  EXPECT_EQ(c.tie_word_embeddings, w["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(c.attention_bias, w["attention_bias"].get<bool>());
  EXPECT_EQ(c.mlp_bias, w["mlp_bias"].get<bool>());
  EXPECT_EQ(c.sliding_window,
            w["sliding_window"].is_null() ? std::nullopt : std::optional(w["sliding_window"].get<int64_t>()));
  EXPECT_EQ(c.torch_dtype, w["torch_dtype"].get<std::string>());
  EXPECT_EQ(c.bos_token_id, w["bos_token_id"].get<std::vector<int64_t>>());
  EXPECT_EQ(c.eos_token_id, w["eos_token_id"].get<std::vector<int64_t>>());
}

std::vector<std::string> fixtures() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(testing::data_path("hf_config"))) {
    const std::string f = e.path().filename().string();
    const std::string suffix = ".expected.json";
    if (f.size() > suffix.size() && f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0) {
      names.push_back(f.substr(0, f.size() - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(HfConfig, ReadsEveryFixtureAsTransformersDoes) {
  const std::vector<std::string> names = fixtures();
  EXPECT_GE(names.size(), 10u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const HfModelConfig c = read_hf_config(testing::data_path("hf_config/" + name + ".json"));
    std::ifstream in(testing::data_path("hf_config/" + name + ".expected.json"));
    expect_matches(c, json::parse(in));
  }
}

TEST(HfConfig, PublishedShapes) {
  const HfModelConfig smol = read_hf_config(testing::data_path("hf_config/smollm2_135m_instruct.json"));
  EXPECT_EQ(smol.head_dim, 64);  // 576 / 9
  EXPECT_TRUE(smol.tie_word_embeddings);
  const HfModelConfig llama = read_hf_config(testing::data_path("hf_config/llama3_2_1b_instruct.json"));
  EXPECT_EQ(llama.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(llama.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(llama.eos_token_id, (std::vector<int64_t>{128001, 128008, 128009}));
  const HfModelConfig qwen = read_hf_config(testing::data_path("hf_config/qwen2_5_0_5b_instruct.json"));
  EXPECT_TRUE(qwen.attention_bias);
  EXPECT_FALSE(qwen.sliding_window.has_value());  // use_sliding_window is false
  const HfModelConfig mistral = read_hf_config(testing::data_path("hf_config/mistral_7b_v0_1.json"));
  EXPECT_EQ(mistral.sliding_window, 4096);
}

// Configs servetune writes; their files were made by hf_config_json and transformers' reading of them is in
// the .expected.json next to them, so the writer's output is known to load in transformers.
std::vector<std::pair<std::string, HfModelConfig>> written_configs() {
  HfModelConfig llama;
  llama.architecture = "LlamaForCausalLM";
  llama.model_type = "llama";
  llama.hidden_size = 256;
  llama.intermediate_size = 688;
  llama.num_hidden_layers = 4;
  llama.num_attention_heads = 8;
  llama.num_key_value_heads = 2;
  llama.head_dim = 32;
  llama.vocab_size = 1024;
  llama.max_position_embeddings = 4096;
  llama.rms_norm_eps = 1e-5;
  llama.rope_theta = 500000.0;
  llama.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 1024};
  llama.tie_word_embeddings = true;
  llama.torch_dtype = "bfloat16";
  llama.bos_token_id = {1};
  llama.eos_token_id = {2, 3};

  HfModelConfig mistral = llama;
  mistral.architecture = "MistralForCausalLM";
  mistral.model_type = "mistral";
  mistral.rope_scaling = {RopeScalingType::kLinear, 2.0, 1.0, 4.0, 0};
  mistral.rope_theta = 10000.0;
  mistral.tie_word_embeddings = false;
  mistral.sliding_window = 512;
  mistral.bos_token_id = {};
  mistral.eos_token_id = {2};

  HfModelConfig qwen = llama;
  qwen.architecture = "Qwen2ForCausalLM";
  qwen.model_type = "qwen2";
  qwen.rope_scaling = {};
  qwen.attention_bias = true;
  qwen.torch_dtype = "float32";
  return {
      {"servetune_written_llama", llama}, {"servetune_written_mistral", mistral}, {"servetune_written_qwen2", qwen}};
}

TEST(HfConfig, WriterOutputIsStableAndReadable) {
  const char* update = std::getenv("SERVETUNE_UPDATE_GOLDENS");
  for (const auto& [name, config] : written_configs()) {
    SCOPED_TRACE(name);
    const std::string path = testing::data_path("hf_config/" + name + ".json");
    const std::string text = hf_config_json(config);
    if (update != nullptr && std::string(update) == "1") {
      write_hf_config(path, config);
      continue;
    }
    EXPECT_EQ(text, read_text(path))
        << "writer output changed; if on purpose, rerun with SERVETUNE_UPDATE_GOLDENS=1 and "
           "then scripts/gen_format_goldens.py so transformers checks it again";
    EXPECT_EQ(parse_hf_config(text, name), config);
  }
}

TEST(HfConfig, EveryFixtureRoundTripsThroughTheWriter) {
  for (const std::string& name : fixtures()) {
    SCOPED_TRACE(name);
    const HfModelConfig c = read_hf_config(testing::data_path("hf_config/" + name + ".json"));
    EXPECT_EQ(parse_hf_config(hf_config_json(c), "rewritten"), c);
  }
}

TEST(HfConfig, ReadsDirectoryAndReportsMissingFile) {
  const fs::path dir = fs::temp_directory_path() /
                       ("servetune_cfg_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  fs::create_directories(dir);
  write_hf_config((dir / "config.json").string(), written_configs()[0].second);
  EXPECT_EQ(read_hf_config(dir.string()), written_configs()[0].second);
  fs::remove_all(dir);
  try {
    read_hf_config(dir.string());
    FAIL() << "read a missing config";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos);
  }
}

struct Bad {
  std::string patch;  // top-level keys replace those of a valid llama config (null deletes the key)
  std::string message;
  ErrorKind kind = ErrorKind::kFormat;
};

std::string error_for(const std::string& text, ErrorKind want) {
  try {
    parse_hf_config(text, "bad/config.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), want) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("bad/config.json: ", 0), 0u) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted " << text;
  return "";
}

TEST(HfConfig, BadConfigsGiveOneClearError) {
  const json base = json::parse(hf_config_json(written_configs()[0].second));
  const std::vector<Bad> cases = {
      {R"({"architectures": ["GPT2LMHeadModel"]})",
       "architecture GPT2LMHeadModel is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
       "Qwen2ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DeepseekV2ForCausalLM, "
       "DeepseekV3ForCausalLM)",
       ErrorKind::kUnsupported},
      {R"({"architectures": "LlamaForCausalLM"})", "key 'architectures' must be a non-empty list"},
      {R"({"architectures": null, "model_type": null})", "neither 'architectures' nor 'model_type'"},
      {R"({"architectures": null, "model_type": "gemma"})", "model_type gemma is not supported",
       ErrorKind::kUnsupported},
      {R"({"hidden_size": null})", "key 'hidden_size' is missing (required)"},
      {R"({"hidden_size": "256"})", "key 'hidden_size' must be an integer, got string \"256\""},
      {R"({"hidden_size": 256.5})", "key 'hidden_size' must be an integer"},
      {R"({"hidden_size": 1e30})", "key 'hidden_size' must be an integer"},
      {R"({"hidden_size": 99999999999999999999})", "key 'hidden_size' must be an integer"},
      {R"({"num_hidden_layers": 0})", "key 'num_hidden_layers' is 0, outside the sensible range"},
      {R"({"num_hidden_layers": -3})", "key 'num_hidden_layers' is -3"},
      {R"({"num_hidden_layers": 2000000})", "key 'num_hidden_layers' is 2000000"},
      {R"({"num_hidden_layers": 18446744073709551615})", "key 'num_hidden_layers' is 18446744073709551615"},
      {R"({"vocab_size": 0})", "key 'vocab_size' is 0"},
      {R"({"head_dim": null, "num_attention_heads": 6})",
       "key 'num_attention_heads' (6) must divide hidden_size (256)"},
      {R"({"num_key_value_heads": 3})", "key 'num_key_value_heads' (3) must divide num_attention_heads (8)"},
      {R"({"num_key_value_heads": 16})", "key 'num_key_value_heads' is 16, outside the sensible range [1, 8]"},
      {R"({"head_dim": 33})", "key 'head_dim' (33) must be even"},
      {R"({"rms_norm_eps": 0})", "key 'rms_norm_eps' must be positive"},
      {R"({"rms_norm_eps": "1e-5"})", "key 'rms_norm_eps' must be a number"},
      {R"({"rope_theta": -1.0})", "key 'rope_theta' must be positive"},
      {R"({"rope_scaling": 3})", "key 'rope_scaling' must be an object or null"},
      {R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
       "key 'rope_scaling.original_max_position_embeddings' is missing (required for yarn rope scaling)"},
      {R"({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})", "rope scaling type 'dynamic' is not supported",
       ErrorKind::kUnsupported},
      {R"({"rope_scaling": {"type": "linear"}})",
       "key 'rope_scaling.factor' is missing (required for linear rope scaling)"},
      {R"({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}})",
       "key 'rope_scaling.low_freq_factor' is missing"},
      {R"({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 1024}})",
       "key 'rope_scaling.high_freq_factor' must be greater than low_freq_factor"},
      {R"({"rope_parameters": {"rope_type": "default", "rope_theta": 0}})",
       "key 'rope_parameters.rope_theta' must be positive"},
      {R"({"hidden_act": "gelu"})", "hidden_act 'gelu' is not supported", ErrorKind::kUnsupported},
      {R"({"tie_word_embeddings": "yes"})", "key 'tie_word_embeddings' must be true or false"},
      {R"({"eos_token_id": -1})", "key 'eos_token_id' must be a non-negative token id"},
      {R"({"eos_token_id": [1, "x"]})", "key 'eos_token_id' must be a non-negative token id"},
      {R"({"torch_dtype": 16})", "key 'torch_dtype' must be a string"},
      {R"({"max_position_embeddings": 0})", "key 'max_position_embeddings' is 0"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.patch);
    json config = base;
    const json patch = json::parse(c.patch);
    for (const auto& [key, value] : patch.items()) {
      if (value.is_null()) {
        config.erase(key);
      } else {
        config[key] = value;
      }
    }
    const std::string message = error_for(config.dump(), c.kind);
    EXPECT_NE(message.find(c.message), std::string::npos) << message;
  }
  EXPECT_NE(error_for("{\"hidden_size\": ", ErrorKind::kFormat).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_for("[1]", ErrorKind::kFormat).find("not a JSON object"), std::string::npos);
  json qwen = json::parse(hf_config_json(written_configs()[2].second));
  qwen["use_sliding_window"] = true;
  EXPECT_NE(error_for(qwen.dump(), ErrorKind::kUnsupported).find("sliding-window"), std::string::npos);
  json mistral = json::parse(hf_config_json(written_configs()[1].second));
  mistral["sliding_window"] = 0;
  EXPECT_NE(error_for(mistral.dump(), ErrorKind::kFormat).find("key 'sliding_window' is 0"), std::string::npos);
}

// quantization_config: DeepSeek-V3's FP8 block scaling is read (and written back); any other quantization is a clear
// Error(kUnsupported) rather than weights misread.
TEST(HfConfig, Fp8BlockQuantizationOnly) {
  json config = json::parse(hf_config_json(written_configs()[0].second));
  config["quantization_config"] =
      json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]})");
  const HfModelConfig c = parse_hf_config(config.dump(), "deepseek-style");
  ASSERT_TRUE(c.quantization.has_value());
  EXPECT_EQ(*c.quantization, HfQuantization{});
  EXPECT_EQ(parse_hf_config(hf_config_json(c), "rewritten"), c);
  EXPECT_FALSE(written_configs()[0].second.quantization.has_value());
  struct BadQuantization {
    std::string value;  // of quantization_config
    std::string message;
    ErrorKind kind = ErrorKind::kUnsupported;
  };
  const std::vector<BadQuantization> cases = {
      {R"({"quant_method": "gptq", "bits": 4})", "quant_method 'gptq' is not supported"},
      {R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})", "fmt 'e5m2' is not supported"},
      {R"({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]})",
       "activation_scheme 'static' is not supported"},
      {R"({"quant_method": "fp8"})", "without weight_block_size (per-tensor FP8 scales) is not supported"},
      {R"({"quant_method": "fp8", "weight_block_size": [64, 64]})", "weight_block_size [64,64] is not supported"},
      {R"({"quant_method": "fp8", "weight_block_size": 128})",
       "key 'quantization_config.weight_block_size' must be two integers", ErrorKind::kFormat},
      {R"(3)", "key 'quantization_config' must be an object or null", ErrorKind::kFormat},
  };
  for (const BadQuantization& bad : cases) {
    SCOPED_TRACE(bad.value);
    config["quantization_config"] = json::parse(bad.value);
    const std::string message = error_for(config.dump(), bad.kind);
    EXPECT_NE(message.find(bad.message), std::string::npos) << message;
  }
  config["quantization_config"] = nullptr;
  EXPECT_FALSE(parse_hf_config(config.dump(), "null").quantization.has_value());
}

// Keys transformers fills in when a config leaves them out.
TEST(HfConfig, TransformersDefaults) {
  const HfModelConfig c = parse_hf_config(
      R"({"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
          "num_attention_heads": 4, "vocab_size": 100})",
      "minimal");
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.bos_token_id, std::vector<int64_t>{1});
  EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{2});
  EXPECT_EQ(supported_hf_architectures().size(), 8u);
}

}  // namespace
}  // namespace servetune

namespace servetune {
namespace {

// A DeepSeek-V3-shaped config (the published keys, tiny sizes) with `patch` merged in.
std::string deepseek_config(const std::string& patch) {
  json c = json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
    "vocab_size": 320, "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
    "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "kv_lora_rank": 32,
    "q_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "routed_scaling_factor": 2.5})");
  c.merge_patch(json::parse(patch));
  return c.dump();
}

TEST(HfConfig, MixtureOfExpertsAndLatentAttentionKeys) {
  const HfModelConfig c = parse_hf_config(deepseek_config("{}"), "v3/config.json");
  EXPECT_EQ(c.moe.num_experts, 16);
  EXPECT_EQ(c.moe.num_experts_per_tok, 4);
  EXPECT_EQ(c.moe.scoring_func, "sigmoid");  // V3's defaults when the keys are absent
  EXPECT_EQ(c.moe.topk_method, "noaux_tc");
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.mla.kv_lora_rank, 32);
  EXPECT_EQ(c.head_dim, 24);  // qk_nope_head_dim + qk_rope_head_dim, whatever "head_dim" says
  EXPECT_EQ(parse_hf_config(deepseek_config(R"({"q_lora_rank": null})"), "x").mla.q_lora_rank, 0);
  // Published Qwen configs say num_experts; transformers 5 writes num_local_experts.
  const std::string qwen = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 320, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, )";
  EXPECT_EQ(parse_hf_config(qwen + R"("num_experts": 8})", "q").moe.num_experts, 8);
  EXPECT_EQ(parse_hf_config(qwen + R"("num_local_experts": 6})", "q").moe.num_experts, 6);
  EXPECT_TRUE(parse_hf_config(qwen + R"("num_experts": 8})", "q").qk_norm);
  // The writer's output reads back the same.
  EXPECT_EQ(parse_hf_config(hf_config_json(c), "again"), c);
}

TEST(HfConfig, InconsistentExpertConfigsNameTheKey) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"n_group": 3})", "key 'n_group' (3) must divide the number of experts (16)"},
      {R"({"num_experts_per_tok": 17})", "key 'num_experts_per_tok' (17) exceeds the number of experts (16)"},
      {R"({"topk_group": 5})", "key 'topk_group' (5) exceeds n_group (4)"},
      {R"({"num_experts_per_tok": 9, "topk_group": 2})", "key 'num_experts_per_tok' (9) exceeds the experts in topk_group"},
      {R"({"kv_lora_rank": null})", "key 'kv_lora_rank' is missing (required)"},
      {R"({"n_routed_experts": null})", "key 'n_routed_experts' is missing (required)"},
      {R"({"scoring_func": "relu"})", "key 'scoring_func' must be \"softmax\" or \"sigmoid\""},
      {R"({"qk_rope_head_dim": 7})", "key 'qk_rope_head_dim' (7) must be even"},
  };
  for (const auto& [patch, message] : cases) {
    SCOPED_TRACE(patch);
    try {
      parse_hf_config(deepseek_config(patch), "bad/config.json");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat);
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace servetune
