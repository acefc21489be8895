// Deterministic random weights (see random_weights.h): splitmix64 streams seeded by (seed, tensor name),
// Box-Muller normals.
#include "model/random_weights.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/quant.h"
#include "model/hf_weights.h"

namespace servetune {
namespace {

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

double uniform01(uint64_t& state) { return (static_cast<double>(splitmix(state) >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

std::vector<RandomTensorSpec> hf_tensor_specs(const HfModelConfig& c) {
  const int64_t d = c.hidden_size, hd = c.head_dim, q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  const HfMoeConfig& moe = c.moe;
  const HfMlaConfig& mla = c.mla;
  const bool mixtral = c.model_type == "mixtral", deepseek = mla.kv_lora_rank > 0;
  std::vector<RandomTensorSpec> specs;
  const auto mlp = [&](const std::string& p, int64_t width, const char* gate, const char* up, const char* down) {
    specs.push_back({p + gate + ".weight", {width, d}, false});
    specs.push_back({p + up + ".weight", {width, d}, false});
    specs.push_back({p + down + ".weight", {d, width}, false});
  };
  ModelConfig shape;  // which layers are MoE, as the engine reads the config
  if (moe.num_experts > 0) shape = model_config_from_hf(c, "random weights");
  // One decoder layer: attention, then a dense MLP or the MoE block.
  const auto layer = [&](int64_t i, bool sparse) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "input_layernorm.weight", {d}, true});
    if (deepseek) {
      const int64_t h = c.num_attention_heads, qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
      if (mla.q_lora_rank > 0) {
        specs.push_back({p + "self_attn.q_a_proj.weight", {mla.q_lora_rank, d}, false});
        specs.push_back({p + "self_attn.q_a_layernorm.weight", {mla.q_lora_rank}, true});
        specs.push_back({p + "self_attn.q_b_proj.weight", {h * qk, mla.q_lora_rank}, false});
      } else {
        specs.push_back({p + "self_attn.q_proj.weight", {h * qk, d}, false});
      }
      specs.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {mla.kv_lora_rank + mla.qk_rope_head_dim, d}, false});
      specs.push_back({p + "self_attn.kv_a_layernorm.weight", {mla.kv_lora_rank}, true});
      specs.push_back({p + "self_attn.kv_b_proj.weight", {h * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank}, false});
      specs.push_back({p + "self_attn.o_proj.weight", {d, h * mla.v_head_dim}, false});
    } else {
      specs.push_back({p + "self_attn.q_proj.weight", {q, d}, false});
      specs.push_back({p + "self_attn.k_proj.weight", {kv, d}, false});
      specs.push_back({p + "self_attn.v_proj.weight", {kv, d}, false});
      if (c.attention_bias) {
        specs.push_back({p + "self_attn.q_proj.bias", {q}, false});
        specs.push_back({p + "self_attn.k_proj.bias", {kv}, false});
        specs.push_back({p + "self_attn.v_proj.bias", {kv}, false});
      }
      if (c.qk_norm) {
        specs.push_back({p + "self_attn.q_norm.weight", {hd}, true});
        specs.push_back({p + "self_attn.k_norm.weight", {hd}, true});
      }
      specs.push_back({p + "self_attn.o_proj.weight", {d, q}, false});
    }
    specs.push_back({p + "post_attention_layernorm.weight", {d}, true});
    if (!sparse) {
      mlp(p, c.intermediate_size, "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj");
      return;
    }
    const std::string router = p + (mixtral ? "block_sparse_moe.gate" : "mlp.gate");
    specs.push_back({router + ".weight", {moe.num_experts, d}, false});
    if (shape.moe.selection_bias) specs.push_back({router + ".e_score_correction_bias", {moe.num_experts}, false});
    for (int64_t e = 0; e < moe.num_experts; ++e) {
      const std::string x = p + (mixtral ? "block_sparse_moe.experts." : "mlp.experts.") + std::to_string(e) + ".";
      if (mixtral) {
        mlp(x, moe.moe_intermediate_size, "w1", "w3", "w2");
      } else {
        mlp(x, moe.moe_intermediate_size, "gate_proj", "up_proj", "down_proj");
      }
    }
    if (shape.moe.shared_ffn > 0) {
      const std::string s = p + (deepseek ? "mlp.shared_experts." : "mlp.shared_expert.");
      mlp(s, shape.moe.shared_ffn, "gate_proj", "up_proj", "down_proj");
      if (shape.moe.shared_gate) specs.push_back({p + "mlp.shared_expert_gate.weight", {1, d}, false});
    }
  };
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, d}, false});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layer(i, moe.num_experts > 0 && shape.moe.moe_layer[static_cast<size_t>(i)]);
  }
  // DeepSeek-V3's multi-token-prediction modules, stored as the layers after the decoder's (model.layers.61 in
  // DeepSeek-V3): a full decoder layer (MoE by the same rule as the others) plus its own embedding, the two input
  // norms, the projection of [embedding; hidden] and the shared head. servetune does not run them; the files carry
  // them so that the checkpoint has the published layout.
  for (int64_t j = 0; j < c.num_nextn_predict_layers; ++j) {
    const int64_t i = c.num_hidden_layers + j;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "embed_tokens.weight", {c.vocab_size, d}, false});
    specs.push_back({p + "enorm.weight", {d}, true});
    specs.push_back({p + "hnorm.weight", {d}, true});
    specs.push_back({p + "eh_proj.weight", {d, 2 * d}, false});
    layer(i, moe.num_experts > 0 && i >= moe.first_k_dense_replace && i % moe.moe_layer_freq == 0);
    specs.push_back({p + "shared_head.norm.weight", {d}, true});
    specs.push_back({p + "shared_head.head.weight", {c.vocab_size, d}, false});
  }
  specs.push_back({"model.norm.weight", {d}, true});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, d}, false});
  return specs;
}

void fill_random_tensor(const RandomTensorSpec& spec, uint64_t seed, float init_std, DType dtype, std::vector<uint8_t>& out) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    throw_usage("random weights can be f32, f16 or bf16, not " + std::string(dtype_name(dtype)));
  }
  int64_t n = 1;
  for (int64_t s : spec.shape) n *= s;
  std::vector<float> values(static_cast<size_t>(n));
  uint64_t state = seed ^ name_hash(spec.hf_name);
  for (int64_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform01(state)));
    const double theta = 2.0 * std::numbers::pi * uniform01(state);
    values[static_cast<size_t>(i)] = static_cast<float>(r * std::cos(theta));
    if (i + 1 < n) values[static_cast<size_t>(i + 1)] = static_cast<float>(r * std::sin(theta));
  }
  for (float& v : values) v = spec.is_norm ? 1.0f + 0.1f * v : init_std * v;
  out.resize(static_cast<size_t>(n * dtype_info(dtype).type_size));
  quantize_row(dtype, values.data(), out.data(), n);
}

RandomWeightSource::RandomWeightSource(const HfModelConfig& config, std::string path, uint64_t seed, float init_std, DType dtype)
    : path_(std::move(path)), seed_(seed), init_std_(init_std), dtype_(dtype), tied_(config.tie_word_embeddings), model_type_(config.model_type) {
  for (auto& spec : hf_tensor_specs(config)) {
    int64_t bytes = dtype_info(dtype).type_size;
    for (const int64_t s : spec.shape) bytes *= s;
    total_bytes_ += bytes;
    specs_.emplace(spec.hf_name, spec);
  }
}

std::optional<RandomRecipe> RandomWeightSource::random_recipe(const std::string& name) const {
  if (name == "output.weight" && tied_) return std::nullopt;
  const std::string hf = hf_tensor_name(name, model_type_);
  auto spec = specs_.find(hf);
  if (spec == specs_.end()) return std::nullopt;
  RandomRecipe r;
  r.shape = spec->second.shape;
  r.seed = seed_ ^ name_hash(hf);
  r.mean = spec->second.is_norm ? 1.0f : 0.0f;
  r.std = spec->second.is_norm ? 0.1f : init_std_;
  r.dtype = dtype_;
  return r;
}

int64_t RandomWeightSource::host_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, data] : data_) bytes += static_cast<int64_t>(data.size());
  return bytes;
}

std::optional<TensorRef> RandomWeightSource::find(const std::string& name) const {
  if (name == "output.weight" && tied_) return std::nullopt;
  const std::string hf = hf_tensor_name(name, model_type_);
  auto spec = specs_.find(hf);
  if (spec == specs_.end()) return std::nullopt;
  auto [it, inserted] = data_.try_emplace(hf);
  if (inserted) fill_random_tensor(spec->second, seed_, init_std_, dtype_, it->second);
  TensorRef ref;
  ref.name = hf;
  ref.type = dtype_;
  ref.shape = spec->second.shape;
  ref.data = it->second.data();
  ref.n_bytes = static_cast<int64_t>(it->second.size());
  return ref;
}

}  // namespace servetune
