// Model hyperparameters from GGUF metadata as llama.cpp writes and reads it (the llama.cpp vendored in the
// llama-cpp-python 0.3.36 sdist is the reference: src/llama-arch.cpp's key names, src/models/<arch>.cpp's semantics).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/checkpoint.h"
#include "model/weight_source.h"

namespace servetune {
namespace {

constexpr const char* kGgufArchitectures = "llama (dense or with experts), qwen2, qwen2moe, qwen3moe, deepseek2";

// llama.cpp's llama_expert_gating_func_type.
enum GgufGating : int64_t { kGatingNone = 0, kGatingSoftmax = 1, kGatingSigmoid = 2 };

class GgufKeys {
 public:
  GgufKeys(const GgufFile& f, const std::string& arch) : f_(f), prefix_(arch + ".") {}
  std::optional<int64_t> opt_int(const std::string& key) const { return f_.get_int(prefix_ + key); }
  std::optional<double> opt_float(const std::string& key) const { return f_.get_float(prefix_ + key); }
  int64_t req_int(const std::string& key) const {
    auto v = opt_int(key);
    if (!v) throw_format(f_.path(), "missing metadata '" + prefix_ + key + "'");
    return *v;
  }
  const std::string& prefix() const { return prefix_; }

 private:
  const GgufFile& f_;
  std::string prefix_;
};

// Rope scaling: none, linear, or (DeepSeek-2 only) yarn. llama.cpp's yarn multiplies cos/sin by a magnitude that only
// deepseek2's graph cancels (with rope.scaling.yarn_log_multiplier set), and servetune's rotary has no magnitude term.
void read_gguf_rope_scaling(const GgufFile& f, const GgufKeys& k, ModelConfig& c) {
  const std::string scaling = f.get_string(k.prefix() + "rope.scaling.type").value_or("none");
  const double factor = k.opt_float("rope.scaling.factor").value_or(k.opt_float("rope.scale_linear").value_or(1.0));
  if (scaling == "none") return;
  if (scaling == "linear") {
    c.rope_scaling = RopeKind::kLinear;
    c.rope_factor = static_cast<float>(factor);
    return;
  }
  if (scaling != "yarn") {
    throw_unsupported(f.path() + ": rope scaling '" + scaling + "' is not supported (supported: none, linear, llama3 via "
                                 "rope_freqs, yarn for deepseek2)");
  }
  const auto log_mul = k.opt_float("rope.scaling.yarn_log_multiplier");
  if (c.architecture != "deepseek2" || !log_mul) {
    throw_unsupported(f.path() + ": yarn rope scaling is supported for deepseek2 with " + k.prefix() +
                      "rope.scaling.yarn_log_multiplier (llama.cpp scales the rotary part's magnitude otherwise)");
  }
  if (k.opt_float("rope.scaling.attn_factor").value_or(1.0) != 1.0 || k.opt_float("rope.scaling.yarn_ext_factor").value_or(1.0) != 1.0) {
    throw_unsupported(f.path() + ": yarn with rope.scaling.attn_factor or yarn_ext_factor other than 1 is not supported");
  }
  c.rope_scaling = RopeKind::kYarn;
  c.rope_factor = static_cast<float>(factor);
  c.rope_original_context = k.opt_int("rope.scaling.original_context_length").value_or(c.context_length);
  c.yarn_beta_fast = static_cast<float>(k.opt_float("rope.scaling.yarn_beta_fast").value_or(32.0));
  c.yarn_beta_slow = static_cast<float>(k.opt_float("rope.scaling.yarn_beta_slow").value_or(1.0));
  // The converter stores 0.1 * mscale_all_dim; llama.cpp's deepseek2 graph scales the softmax as transformers does.
  c.attention_scale_factor = yarn_softmax_scale(factor, *log_mul);
}

// Experts and routing, as llama.cpp's graphs run them (src/models/<arch>.cpp build_moe_ffn arguments): softmax
// scores renormalised over the chosen experts for llama (Mixtral) and qwen3moe, not for qwen2moe; deepseek2 by
// expert_gating_func (absent: softmax, llama.cpp's default for old DeepSeek-V2 files) and expert_weights_norm.
// Group-limited selection ranks groups by the sum of their two best scores in every family (llama.cpp has no
// max-of-group rule, so a DeepSeek-V2 group_limited_greedy model runs V3's rule there, and here).
void read_gguf_moe(const GgufFile& f, const GgufKeys& k, ModelConfig& c) {
  const int64_t n_experts = k.opt_int("expert_count").value_or(0);
  if (n_experts <= 0) {
    if (c.architecture == "qwen2moe" || c.architecture == "qwen3moe" || c.architecture == "deepseek2") {
      throw_format(f.path(), "missing metadata '" + k.prefix() + "expert_count' (" + c.architecture + " has experts)");
    }
    return;
  }
  MoeConfig& m = c.moe;
  MoeRouting& r = m.routing;
  r.n_experts = n_experts;
  r.top_k = k.req_int("expert_used_count");
  // Absent width: llama.cpp's fallbacks (Mixtral-style llama: the dense width; the qwen families: it over top_k).
  const bool qwen = c.architecture == "qwen2moe" || c.architecture == "qwen3moe";
  m.expert_ffn = k.opt_int("expert_feed_forward_length").value_or(qwen && r.top_k > 0 ? c.ffn / r.top_k : c.ffn);
  const double scale = k.opt_float("expert_weights_scale").value_or(0.0);
  r.scaling = scale != 0.0 ? static_cast<float>(scale) : 1.0f;  // llama.cpp: 0 (absent) means no scaling
  if (const int64_t groups = k.opt_int("expert_group_count").value_or(0); groups > 1) {
    r.n_group = groups;
    r.topk_group = k.req_int("expert_group_used_count");
    r.group_score = MoeGroupScore::kTopTwoSum;
  }
  int64_t dense_lead = 0;
  if (c.architecture == "llama" || c.architecture == "qwen3moe") {
    r.renormalize = true;
  } else if (c.architecture == "qwen2moe") {
    m.shared_ffn = k.opt_int("expert_shared_feed_forward_length").value_or(c.ffn);
    m.shared_gate = true;
  } else if (c.architecture == "deepseek2") {
    const int64_t gating = k.opt_int("expert_gating_func").value_or(kGatingNone);
    if (gating != kGatingNone && gating != kGatingSoftmax && gating != kGatingSigmoid) {
      throw_unsupported(f.path() + ": " + k.prefix() + "expert_gating_func " + std::to_string(gating) +
                        " is not supported (supported: 1 softmax, 2 sigmoid)");
    }
    r.scoring = gating == kGatingSigmoid ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
    r.renormalize = f.get_bool(k.prefix() + "expert_weights_norm").value_or(false);
    m.shared_ffn = k.opt_int("expert_shared_count").value_or(0) * m.expert_ffn;
    dense_lead = k.opt_int("leading_dense_block_count").value_or(0);
    // DeepSeek-V3's selection-only bias: llama.cpp uses it wherever the file has it.
    m.selection_bias = dense_lead < c.n_layers && f.tensor(blk(dense_lead, "exp_probs_b.bias")) != nullptr;
  } else {
    throw_unsupported(f.path() + ": experts in a '" + c.architecture + "' model are not supported (supported: " +
                      kGgufArchitectures + ")");
  }
  m.moe_layer.assign(static_cast<size_t>(std::max<int64_t>(c.n_layers, 0)), false);
  for (int64_t l = 0; l < c.n_layers; ++l) m.moe_layer[static_cast<size_t>(l)] = l >= dense_lead;
}

// DeepSeek-2 latent attention. The converter writes key_length = kv_lora_rank + rope and value_length = kv_lora_rank
// (the absorbed single-head view) with the per-head sizes in key_length_mla / value_length_mla; files from before that
// split carry the per-head sizes in key_length / value_length (and an unsplit attn_kv_b).
void read_gguf_mla(const GgufKeys& k, ModelConfig& c) {
  MlaConfig& m = c.mla;
  m.kv_lora_rank = k.req_int("attention.kv_lora_rank");
  m.q_lora_rank = k.opt_int("attention.q_lora_rank").value_or(0);  // 0 or absent: plain attn_q
  const auto key_mla = k.opt_int("attention.key_length_mla");
  c.head_dim = key_mla ? *key_mla : k.req_int("attention.key_length");
  m.v_head_dim = key_mla ? k.req_int("attention.value_length_mla") : k.req_int("attention.value_length");
  c.rope_dim = k.req_int("rope.dimension_count");
  m.qk_rope_dim = c.rope_dim;
  m.qk_nope_dim = c.head_dim - c.rope_dim;
  c.n_kv_heads = c.n_heads;  // the file's head_count_kv 1 is the absorbed view; the cache holds one latent row anyway
}

}  // namespace

ModelConfig read_gguf_config(const GgufFile& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch) throw_format(f.path(), "missing metadata 'general.architecture'");
  c.architecture = *arch;
  if (c.architecture != "llama" && c.architecture != "qwen2" && c.architecture != "qwen2moe" &&
      c.architecture != "qwen3moe" && c.architecture != "deepseek2") {
    throw_unsupported(f.path() + ": architecture '" + c.architecture + "' is not supported (supported: " + kGgufArchitectures + ")");
  }
  const GgufKeys k(f, c.architecture);
  c.n_layers = k.req_int("block_count");
  c.hidden = k.req_int("embedding_length");
  c.n_heads = k.req_int("attention.head_count");
  c.n_kv_heads = k.opt_int("attention.head_count_kv").value_or(c.n_heads);
  c.head_dim = k.opt_int("attention.key_length").value_or(c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.context_length = k.req_int("context_length");
  // Families whose every layer routes may omit the dense width; it then only sizes nothing.
  const bool all_moe = c.architecture == "qwen2moe" || c.architecture == "qwen3moe" ||
                       (c.architecture == "llama" && k.opt_int("expert_count").value_or(0) > 0);
  c.ffn = all_moe ? k.opt_int("feed_forward_length").value_or(k.opt_int("expert_feed_forward_length").value_or(0))
                  : k.req_int("feed_forward_length");
  c.rms_eps = static_cast<float>(k.opt_float("attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_theta = static_cast<float>(k.opt_float("rope.freq_base").value_or(10000.0));
  c.rope_dim = k.opt_int("rope.dimension_count").value_or(c.head_dim);
  // llama.cpp's rope type per architecture: NeoX halves for the qwen families, interleaved pairs for llama (whose
  // converter permutes q/k to match) and deepseek2 (whose checkpoints rotate interleaved pairs already).
  c.rope_neox = c.architecture == "qwen2" || c.architecture == "qwen2moe" || c.architecture == "qwen3moe";
  c.attention_bias = c.architecture == "qwen2" || c.architecture == "qwen2moe";
  c.qk_norm = c.architecture == "qwen3moe";
  if (c.architecture == "deepseek2") read_gguf_mla(k, c);
  read_gguf_rope_scaling(f, k, c);
  if (auto v = k.opt_int("vocab_size")) {
    c.vocab = *v;
  } else if (const GgufValue* tokens = f.find("tokenizer.ggml.tokens")) {
    c.vocab = static_cast<int64_t>(tokens->size());
  } else if (const GgufTensorInfo* emb = f.tensor("token_embd.weight"); emb && emb->dims.size() == 2) {
    c.vocab = emb->dims[1];
  }
  c.tied_embeddings = f.tensor("output.weight") == nullptr;
  read_gguf_moe(f, k, c);
  validate_model_config(c, f.path());
  return c;
}

}  // namespace servetune
