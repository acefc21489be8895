// Hyperparameters of a decoder (llama family; mixture-of-experts and latent-attention families), read from GGUF
// metadata or an HF config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/moe_routing.h"
#include "servetune/model_info.h"

namespace servetune {

enum class RopeKind { kNone, kLinear, kLlama3, kYarn };

// The mixture-of-experts FFN (routing.n_experts == 0: every layer is dense).
struct MoeConfig {
  MoeRouting routing;      // how a token picks its experts (n_experts, top_k, scoring, groups, weights)
  int64_t expert_ffn = 0;  // one routed expert's width
  int64_t shared_ffn = 0;  // the always-on shared expert MLP's width (DeepSeek: n_shared * expert_ffn); 0: none
  bool shared_gate = false;     // qwen2_moe: the shared expert's output scaled by sigmoid(x . w)
  bool selection_bias = false;  // DeepSeek-V3 e_score_correction_bias: added to the scores for selection only
  std::vector<bool> moe_layer;  // per layer: routed experts (true) or the dense MLP of width ffn
};

// Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank == 0: ordinary attention). The cache holds per token and
// layer one latent row of kv_lora_rank + qk_rope_dim values instead of per-head K and V.
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: queries projected straight from the hidden state
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_dim = 0;
  int64_t qk_rope_dim = 0;
  int64_t v_head_dim = 0;
};

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
  float yarn_beta_fast = 32.0f;  // yarn: the ramp between extrapolated and interpolated frequencies
  float yarn_beta_slow = 1.0f;
  float attention_scale_factor = 1.0f;  // multiplies 1/sqrt(head_dim) (DeepSeek's yarn mscale squared)
  bool attention_bias = false;  // q/k/v projections carry biases (qwen2)
  bool tied_embeddings = false;
  bool qk_norm = false;  // RMSNorm over each head's q and k before rotary (qwen3)
  // DeepSeek-V3's multi-token-prediction ("next-n") layers stored after the decoder's (blk.{n_layers + j}): draft heads
  // for speculative decoding (model/moe_decoder.h's next-n mode), not part of the forward pass.
  int64_t nextn_layers = 0;
  MoeConfig moe;
  MlaConfig mla;

  bool is_moe() const { return moe.routing.n_experts > 0; }
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  // Values one token's cache entry holds per layer and KV head: K and V of head_dim each, or MLA's one latent row.
  int64_t kv_values_per_head() const { return is_mla() ? mla.kv_lora_rank + mla.qk_rope_dim : 2 * head_dim; }
  // KV heads an unsharded model caches: its KV heads, or the one latent row every head shares (MLA).
  int64_t cache_heads() const { return is_mla() ? 1 : n_kv_heads; }
  // Values one token takes in a cache of `kv_heads` heads per layer, over all layers.
  int64_t kv_values_per_token(int64_t kv_heads) const { return n_layers * kv_heads * kv_values_per_head(); }

  int64_t q_width() const { return n_heads * head_dim; }
  int64_t kv_width() const { return n_kv_heads * head_dim; }
};

// Checks internal consistency (positive sizes, heads divisible by KV heads, rope_dim even and <= head_dim);
// throws Error(kFormat) naming `source` and the offending value.
void validate_model_config(const ModelConfig& c, const std::string& source);

// The public view of a config (servetune/model_info.h).
ModelInfo model_info_of(const ModelConfig& c);

// DeepSeek's yarn softmax scale, (1 + log_multiplier * ln(factor))^2, where log_multiplier is 0.1 * mscale_all_dim
// (HF config) or GGUF's rope.scaling.yarn_log_multiplier; 1 when factor <= 1.
float yarn_softmax_scale(double factor, double log_multiplier);

// Per-frequency divisors (rope_dim / 2 values) for kLlama3 and kYarn scaling; empty otherwise.
std::vector<float> rope_freq_factors(const ModelConfig& c);

}  // namespace servetune
