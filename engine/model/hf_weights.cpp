// HF config and tensor-name mapping (see hf_weights.h).
#include "model/hf_weights.h"

#include <regex>

#include "core/error.h"

namespace servetune {

ModelConfig model_config_from_hf(const HfModelConfig& hf, const std::string& source) {
  ModelConfig c;
  c.architecture = hf.model_type == "qwen2" ? "qwen2" : "llama";
  c.n_layers = hf.num_hidden_layers;
  c.hidden = hf.hidden_size;
  c.n_heads = hf.num_attention_heads;
  c.n_kv_heads = hf.num_key_value_heads;
  c.head_dim = hf.head_dim;
  c.ffn = hf.intermediate_size;
  c.vocab = hf.vocab_size;
  c.context_length = hf.max_position_embeddings;
  c.rms_eps = static_cast<float>(hf.rms_norm_eps);
  c.rope_theta = static_cast<float>(hf.rope_theta);
  c.rope_dim = hf.head_dim;
  c.rope_neox = true;  // HF checkpoints keep q/k unpermuted: rotate (i, i + d/2)
  switch (hf.rope_scaling.type) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      c.rope_scaling = RopeKind::kLinear;
      c.rope_factor = static_cast<float>(hf.rope_scaling.factor);
      break;
    case RopeScalingType::kLlama3:
      c.rope_scaling = RopeKind::kLlama3;
      c.rope_factor = static_cast<float>(hf.rope_scaling.factor);
      c.rope_low_freq_factor = static_cast<float>(hf.rope_scaling.low_freq_factor);
      c.rope_high_freq_factor = static_cast<float>(hf.rope_scaling.high_freq_factor);
      c.rope_original_context = hf.rope_scaling.original_max_position_embeddings;
      break;
  }
  c.attention_bias = hf.attention_bias;
  c.tied_embeddings = hf.tie_word_embeddings;
  if (hf.mlp_bias) throw_unsupported(source + ": mlp_bias is not supported");
  if (hf.model_type == "llama" && hf.attention_bias) {
    throw_unsupported(source + ": llama attention_bias (a bias on o_proj too) is not supported; qwen2-style q/k/v biases are");
  }
  if (hf.sliding_window) throw_unsupported(source + ": sliding-window attention is not supported");
  validate_model_config(c, source);
  return c;
}

std::string hf_tensor_name(const std::string& name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  static const std::regex layer(R"(blk\.(\d+)\.(\w+)\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(name, m, layer)) return "";
  static const std::pair<const char*, const char*> kMap[] = {
      {"attn_norm", "input_layernorm"},      {"attn_q", "self_attn.q_proj"},  {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},        {"attn_output", "self_attn.o_proj"},
      {"ffn_norm", "post_attention_layernorm"}, {"ffn_gate", "mlp.gate_proj"}, {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  for (const auto& [gguf, hf] : kMap) {
    if (m[2] == gguf) return "model.layers." + m[1].str() + "." + hf + "." + m[3].str();
  }
  return "";
}

void SafetensorsWeightSource::copied(const uint8_t* data, int64_t bytes) const {
  for (const SafetensorsFile& file : set_.files()) file.drop_pages(data, static_cast<size_t>(bytes));  // its own only
}

std::optional<TensorRef> SafetensorsWeightSource::find(const std::string& name) const {
  // A weight's block scales (FP8 checkpoints) sit beside it under its HF name plus the same suffix.
  const std::string scale_suffix = block_scale_name("");
  const bool is_scale = name.ends_with(scale_suffix);
  const std::string weight = is_scale ? name.substr(0, name.size() - scale_suffix.size()) : name;
  if (weight == "output.weight" && tied_) return std::nullopt;
  std::string hf = hf_tensor_name(weight);
  if (hf.empty()) return std::nullopt;
  if (is_scale) hf = block_scale_name(hf);
  const SafetensorsTensor* t = set_.tensor(hf);
  if (t == nullptr) return std::nullopt;
  TensorRef ref;
  ref.name = hf;
  ref.type = t->dtype;
  ref.shape = t->shape;
  ref.data = t->data.data();
  ref.n_bytes = static_cast<int64_t>(t->data.size());
  return ref;
}

}  // namespace servetune
