// Hyperparameters of a llama-family decoder, read from GGUF metadata or an HF config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "servetune/model_info.h"

namespace servetune {

enum class RopeKind { kNone, kLinear, kLlama3 };

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2", ...
  int64_t n_layers = 0;
  int64_t hidden = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
  int64_t context_length = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int64_t rope_dim = 0;
  bool rope_neox = false;  // NeoX-style pairs (HF weights, qwen2); false: interleaved pairs (GGUF llama)
  RopeKind rope_scaling = RopeKind::kNone;
  float rope_factor = 1.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int64_t rope_original_context = 8192;
  bool attention_bias = false;  // q/k/v projections carry biases (qwen2)
  bool tied_embeddings = false;

  int64_t q_width() const { return n_heads * head_dim; }
  int64_t kv_width() const { return n_kv_heads * head_dim; }
};

// Checks internal consistency (positive sizes, heads divisible by KV heads, rope_dim even and <= head_dim);
// throws Error(kFormat) naming `source` and the offending value.
void validate_model_config(const ModelConfig& c, const std::string& source);

// The public view of a config (servetune/model_info.h).
ModelInfo model_info_of(const ModelConfig& c);

// Llama-3 rope frequency factors (rope_dim / 2 values) for kLlama3 scaling; empty otherwise.
std::vector<float> llama3_rope_freq_factors(const ModelConfig& c);

}  // namespace servetune
