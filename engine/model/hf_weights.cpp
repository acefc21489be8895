// HF config and tensor-name mapping (see hf_weights.h).
#include "model/hf_weights.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "core/error.h"

namespace servetune {

namespace {

// Which layers are MoE, as each family decides it.
std::vector<bool> moe_layers(const HfModelConfig& hf) {
  const HfMoeConfig& m = hf.moe;
  std::vector<bool> moe(static_cast<size_t>(hf.num_hidden_layers), false);
  for (int64_t l = 0; l < hf.num_hidden_layers; ++l) {
    bool sparse = true;
    if (hf.model_type == "deepseek_v2" || hf.model_type == "deepseek_v3") {
      sparse = l >= m.first_k_dense_replace && l % m.moe_layer_freq == 0;
    } else if (hf.model_type == "qwen2_moe" || hf.model_type == "qwen3_moe") {
      sparse = std::find(m.mlp_only_layers.begin(), m.mlp_only_layers.end(), l) == m.mlp_only_layers.end() &&
               (l + 1) % m.decoder_sparse_step == 0;
    }
    moe[static_cast<size_t>(l)] = sparse;
  }
  return moe;
}

// The routing rule of each family (transformers' modeling_<family>.py).
void set_routing(const HfModelConfig& hf, MoeConfig& c) {
  const HfMoeConfig& h = hf.moe;
  MoeRouting& m = c.routing;
  m.n_experts = h.num_experts;
  m.top_k = h.num_experts_per_tok;
  c.expert_ffn = h.moe_intermediate_size;
  m.renormalize = h.norm_topk_prob;
  if (hf.model_type == "mixtral" || hf.model_type == "qwen2_moe" || hf.model_type == "qwen3_moe") {
    c.shared_ffn = h.shared_expert_intermediate_size;
    c.shared_gate = hf.model_type == "qwen2_moe";
    return;
  }
  // DeepSeek: shared experts form one MLP; V3 scores by sigmoid with a selection-only bias and groups ranked by the
  // sum of their top two; V2 by softmax, groups by their best. V2 scales only when it does not renormalise.
  c.shared_ffn = h.n_shared_experts * h.moe_intermediate_size;
  m.scoring = h.scoring_func == "sigmoid" ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
  if (h.topk_method != "greedy") {
    m.n_group = h.n_group;
    m.topk_group = h.topk_group;
  }
  if (h.topk_method == "noaux_tc") {
    m.group_score = MoeGroupScore::kTopTwoSum;
    c.selection_bias = true;
    m.scaling = static_cast<float>(h.routed_scaling_factor);
  } else {
    m.group_score = MoeGroupScore::kMax;
    const bool renormalises = h.num_experts_per_tok > 1 && h.norm_topk_prob;
    m.renormalize = renormalises;
    m.scaling = renormalises ? 1.0f : static_cast<float>(h.routed_scaling_factor);
  }
}

// DeepSeek's yarn softmax scale when mscale_all_dim is set.
float yarn_attention_scale(const RopeScaling& r) {
  if (r.type != RopeScalingType::kYarn || r.mscale_all_dim == 0.0) return 1.0f;
  return yarn_softmax_scale(r.factor, 0.1 * r.mscale_all_dim);
}

}  // namespace

ModelConfig model_config_from_hf(const HfModelConfig& hf, const std::string& source) {
  ModelConfig c;
  c.architecture = hf.model_type == "llama" || hf.model_type == "mistral" ? "llama" : hf.model_type;
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
    case RopeScalingType::kYarn: {
      // transformers scales cos/sin by mscale(factor, mscale) / mscale(factor, mscale_all_dim); servetune's rotary
      // has no magnitude term, so only configs where that ratio is 1 (DeepSeek's own) are accepted.
      const RopeScaling& r = hf.rope_scaling;
      if (r.mscale == 0.0 || r.mscale != r.mscale_all_dim) {
        throw_unsupported(source + ": yarn rope scaling is supported with equal mscale and mscale_all_dim (as DeepSeek "
                                   "ships it); this config would scale the rotary part by another factor");
      }
      c.rope_scaling = RopeKind::kYarn;
      c.rope_factor = static_cast<float>(r.factor);
      c.rope_original_context = r.original_max_position_embeddings;
      c.yarn_beta_fast = static_cast<float>(r.beta_fast);
      c.yarn_beta_slow = static_cast<float>(r.beta_slow);
      c.attention_scale_factor = yarn_attention_scale(r);
      break;
    }
  }
  c.attention_bias = hf.attention_bias;
  c.tied_embeddings = hf.tie_word_embeddings;
  c.qk_norm = hf.qk_norm;
  c.nextn_layers = hf.num_nextn_predict_layers;
  if (hf.mla.kv_lora_rank > 0) {
    c.mla = {hf.mla.q_lora_rank, hf.mla.kv_lora_rank, hf.mla.qk_nope_head_dim, hf.mla.qk_rope_head_dim, hf.mla.v_head_dim};
    c.rope_dim = hf.mla.qk_rope_head_dim;
    c.rope_neox = false;  // DeepSeek rotates interleaved pairs (2i, 2i + 1) of q_pe and k_pe
    if (hf.attention_bias) throw_unsupported(source + ": attention_bias on a DeepSeek model is not supported");
  }
  if (hf.moe.num_experts > 0) {
    set_routing(hf, c.moe);
    c.moe.moe_layer = moe_layers(hf);
  }
  if (hf.mlp_bias) throw_unsupported(source + ": mlp_bias is not supported");
  if (hf.model_type == "llama" && hf.attention_bias) {
    throw_unsupported(source + ": llama attention_bias (a bias on o_proj too) is not supported; qwen2-style q/k/v biases are");
  }
  if (hf.sliding_window) throw_unsupported(source + ": sliding-window attention is not supported");
  validate_model_config(c, source);
  return c;
}

std::string hf_tensor_name(const std::string& name, const std::string& model_type) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  // blk.L.nextn.<tensor>.weight: a multi-token-prediction layer's own tensors (llama.cpp's names).
  static const std::regex nextn(R"(blk\.(\d+)\.nextn\.(\w+)\.weight)");
  std::smatch n;
  if (std::regex_match(name, n, nextn)) {
    static const std::pair<const char*, const char*> kNextn[] = {
        {"eh_proj", "eh_proj"}, {"enorm", "enorm"}, {"hnorm", "hnorm"}, {"embed_tokens", "embed_tokens"},
        {"shared_head_norm", "shared_head.norm"}, {"shared_head_head", "shared_head.head"}};
    for (const auto& [gguf, hf] : kNextn) {
      if (n[2].str() == gguf) return "model.layers." + n[1].str() + "." + hf + ".weight";
    }
    return "";
  }
  // blk.L.<tensor>[.E].weight|bias: E numbers one expert (llama.cpp's per-expert names).
  static const std::regex layer(R"(blk\.(\d+)\.(\w+?)(?:\.(\d+))?\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(name, m, layer)) return "";
  const std::string prefix = "model.layers." + m[1].str() + ".";
  const std::string tensor = m[2].str(), suffix = "." + m[4].str();
  const bool mixtral = model_type == "mixtral";
  const bool deepseek = model_type == "deepseek_v2" || model_type == "deepseek_v3";
  if (m[3].matched) {  // one routed expert's matrix
    const std::string experts = prefix + (mixtral ? "block_sparse_moe.experts." : "mlp.experts.") + m[3].str() + ".";
    if (tensor == "ffn_gate") return experts + (mixtral ? "w1" : "gate_proj") + suffix;
    if (tensor == "ffn_down") return experts + (mixtral ? "w2" : "down_proj") + suffix;
    if (tensor == "ffn_up") return experts + (mixtral ? "w3" : "up_proj") + suffix;
    return "";
  }
  static const std::pair<const char*, const char*> kMap[] = {
      {"attn_norm", "input_layernorm"},      {"attn_q", "self_attn.q_proj"},  {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},        {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"},   {"attn_k_norm", "self_attn.k_norm"},
      {"attn_q_a", "self_attn.q_a_proj"},    {"attn_q_a_norm", "self_attn.q_a_layernorm"},
      {"attn_q_b", "self_attn.q_b_proj"},    {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"},
      {"attn_kv_a_norm", "self_attn.kv_a_layernorm"}, {"attn_kv_b", "self_attn.kv_b_proj"},
      {"ffn_norm", "post_attention_layernorm"}, {"ffn_gate", "mlp.gate_proj"}, {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  for (const auto& [gguf, hf] : kMap) {
    if (tensor == gguf) return prefix + hf + suffix;
  }
  if (tensor == "ffn_gate_inp") return prefix + (mixtral ? "block_sparse_moe.gate" : "mlp.gate") + suffix;
  if (tensor == "exp_probs_b" && deepseek) return prefix + "mlp.gate.e_score_correction_bias";
  const std::string shared = deepseek ? "mlp.shared_experts." : "mlp.shared_expert.";
  if (tensor == "ffn_gate_shexp") return prefix + shared + "gate_proj" + suffix;
  if (tensor == "ffn_up_shexp") return prefix + shared + "up_proj" + suffix;
  if (tensor == "ffn_down_shexp") return prefix + shared + "down_proj" + suffix;
  if (tensor == "ffn_gate_inp_shexp") return prefix + "mlp.shared_expert_gate" + suffix;
  return "";
}

std::string SafetensorsWeightSource::file_name(const std::string& name) const {
  const std::string hf = hf_tensor_name(name, model_type_);
  return hf.empty() ? name : hf;
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
  std::string hf = hf_tensor_name(weight, model_type_);
  if (hf.empty()) return std::nullopt;
  if (is_scale) hf = block_scale_name(hf);
  const SafetensorsTensor* t = set_.tensor(hf);
  if (t == nullptr) return std::nullopt;
  return tensor_ref(hf, *t);
}

TensorRef tensor_ref(const std::string& file_name, const SafetensorsTensor& t) {
  TensorRef ref;
  ref.name = file_name;
  ref.type = t.dtype;
  ref.shape = t.shape;
  ref.data = t.data.data();
  ref.n_bytes = static_cast<int64_t>(t.data.size());
  return ref;
}

}  // namespace servetune
