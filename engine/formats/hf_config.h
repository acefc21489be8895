// HuggingFace config.json for the llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM):
// parsed into a plain struct with transformers' defaults filled in and every value range-checked, and written back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace servetune {

enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                           // linear and llama3
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  int64_t original_max_position_embeddings = 0;  // llama3
  bool operator==(const RopeScaling&) const = default;
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
  std::string architecture;  // "LlamaForCausalLM", "MistralForCausalLM" or "Qwen2ForCausalLM"
  std::string model_type;    // "llama", "mistral", "qwen2"
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

// config.json text (2-space indented, keys in transformers' order) that parse_hf_config and transformers'
// AutoConfig read back to the same values.
std::string hf_config_json(const HfModelConfig& config);
void write_hf_config(const std::string& path, const HfModelConfig& config);

}  // namespace servetune
