// Deterministic random llama weights (see random_weights.h): splitmix64 streams seeded by (seed, tensor name),
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

std::vector<RandomTensorSpec> llama_tensor_specs(const HfModelConfig& c) {
  const int64_t d = c.hidden_size, hd = c.head_dim, q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  std::vector<RandomTensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, d}, false});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "input_layernorm.weight", {d}, true});
    specs.push_back({p + "self_attn.q_proj.weight", {q, d}, false});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, d}, false});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, d}, false});
    if (c.attention_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q}, false});
      specs.push_back({p + "self_attn.k_proj.bias", {kv}, false});
      specs.push_back({p + "self_attn.v_proj.bias", {kv}, false});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {d, q}, false});
    specs.push_back({p + "post_attention_layernorm.weight", {d}, true});
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, d}, false});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, d}, false});
    specs.push_back({p + "mlp.down_proj.weight", {d, c.intermediate_size}, false});
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
    : path_(std::move(path)), seed_(seed), init_std_(init_std), dtype_(dtype), tied_(config.tie_word_embeddings) {
  for (auto& spec : llama_tensor_specs(config)) specs_.emplace(spec.hf_name, spec);
}

std::optional<RandomRecipe> RandomWeightSource::random_recipe(const std::string& name) const {
  if (name == "output.weight" && tied_) return std::nullopt;
  const std::string hf = hf_tensor_name(name);
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

std::optional<TensorRef> RandomWeightSource::find(const std::string& name) const {
  if (name == "output.weight" && tied_) return std::nullopt;
  const std::string hf = hf_tensor_name(name);
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
