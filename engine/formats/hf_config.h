// HuggingFace config.json of the supported decoder families (llama, mistral, qwen2; the mixture-of-experts families
// mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3): parsed into a plain struct with transformers' defaults
// filled in and every value range-checked, and written back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace servetune {

enum class RopeScalingType { kNone, kLinear, kLlama3, kYarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                           // linear and llama3
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  int64_t original_max_position_embeddings = 0;  // llama3 and yarn
  double beta_fast = 32.0;                       // yarn: the band edges, in rotations over the original context
  double beta_slow = 1.0;
  double mscale = 0.0;                           // yarn (DeepSeek): 0 when absent
  double mscale_all_dim = 0.0;
  bool operator==(const RopeScaling&) const = default;
};

// The mixture-of-experts part of a config (num_experts == 0: a dense model). Each family's own keys
// (num_local_experts, num_experts, n_routed_experts, ...) are read into these common fields.
struct HfMoeConfig {
  int64_t num_experts = 0;             // routed experts
  int64_t num_experts_per_tok = 0;     // top-k
  int64_t moe_intermediate_size = 0;   // one routed expert's width (mixtral: intermediate_size)
  int64_t n_shared_experts = 0;        // deepseek: always-on experts, together one MLP n_shared * moe_intermediate wide
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe: the sigmoid-gated shared expert's width
  bool norm_topk_prob = false;         // the chosen weights renormalised to sum to 1
  double routed_scaling_factor = 1.0;  // deepseek
  std::string scoring_func = "softmax";  // "softmax" or "sigmoid" (deepseek_v3)
  std::string topk_method = "greedy";    // "greedy", "group_limited_greedy" (v2) or "noaux_tc" (v3)
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;   // deepseek: the first k layers have a dense MLP
  int64_t moe_layer_freq = 1;          // deepseek: every k-th layer after those is MoE
  int64_t decoder_sparse_step = 1;     // qwen: every k-th layer is MoE
  std::vector<int64_t> mlp_only_layers;  // qwen: these layers are dense
  bool operator==(const HfMoeConfig&) const = default;
};

// Multi-head latent attention (deepseek_v2 / deepseek_v3); kv_lora_rank == 0: ordinary attention.
struct HfMlaConfig {
  int64_t q_lora_rank = 0;  // 0: q_proj straight from the hidden state (V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool operator==(const HfMlaConfig&) const = default;
};

// quantization_config of an FP8 checkpoint whose weights carry 128x128 block scales (DeepSeek-V3/R1, transformers'
// FineGrainedFP8Config): the one HF quantization servetune reads. Other methods, formats, block sizes and static
// activation scales are Error(kUnsupported) when parsed.
struct HfQuantization {
  std::string quant_method = "fp8";
  std::string fmt = "e4m3";
  std::string activation_scheme = "dynamic";  // activations stay f32 (the CPU kernels take no activation scales)
  std::vector<int64_t> weight_block_size = {128, 128};
  bool operator==(const HfQuantization&) const = default;
};

struct HfModelConfig {
  std::string architecture;  // "LlamaForCausalLM", ... (supported_hf_architectures())
  std::string model_type;    // "llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", ...
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;            // bias on q/k/v (always on for qwen2; llama's flag also puts one on o_proj)
  bool mlp_bias = false;                  // llama only
  bool qk_norm = false;                   // qwen3_moe: RMSNorm of each head's q and k before rotary
  HfMoeConfig moe;
  HfMlaConfig mla;
  int64_t num_nextn_predict_layers = 0;   // deepseek_v3: multi-token-prediction layers stored after the decoder's
  bool eagle_head = false;                // architectures [LlamaForCausalLMEagle]: a draft head (model/eagle_head.h)
  std::optional<int64_t> sliding_window;  // mistral's window; qwen2's only when use_sliding_window is true
  std::string torch_dtype;                // "bfloat16", "float16", "float32" or "" when absent
  std::vector<int64_t> bos_token_id;      // empty when absent or null; a list when the file has one
  std::vector<int64_t> eos_token_id;
  std::optional<HfQuantization> quantization;  // quantization_config; nullopt when absent or null

  bool operator==(const HfModelConfig&) const = default;
};

// The architectures parse_hf_config accepts, for messages and `make-model`.
const std::vector<std::string>& supported_hf_architectures();

// Parses config.json text; `name` (the path) is used in error messages. Throws Error(kFormat) naming the file
// and the key for invalid JSON, a missing required key, a wrong type or an absurd value, and
// Error(kUnsupported) for an architecture, activation or rope scaling servetune does not implement.
HfModelConfig parse_hf_config(std::string_view json_text, const std::string& name);
// Reads and parses `path` (a config.json file, or a directory holding one). Error(kIo) if it cannot be read.
HfModelConfig read_hf_config(const std::string& path);
// EAGLE-2 draft heads' architecture name (SGLang's): a llama-family config with one layer.
inline constexpr std::string_view kEagleHeadArchitecture = "LlamaForCausalLMEagle";

// config.json text (2-space indented, keys in transformers' order) that parse_hf_config and transformers'
// AutoConfig read back to the same values.
std::string hf_config_json(const HfModelConfig& config);
void write_hf_config(const std::string& path, const HfModelConfig& config);

}  // namespace servetune
