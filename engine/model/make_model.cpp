// Random-weight HF checkpoints (see make_model.h and servetune/make_model.h).
#include "model/make_model.h"

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"
#include "model/random_weights.h"
#include "tokenizer/unicode.h"

namespace servetune {
namespace {

// The dense llama-family presets: one row each.
struct Shape {
  const char* name;
  const char* model_type;
  int64_t vocab, hidden, ffn, layers, heads, kv_heads, context;
  double theta, eps;
  bool tied;
  double llama3_factor;  // 0: no rope scaling
  int64_t llama3_original_context;
};

constexpr Shape kPresets[] = {
    {"tiny", "llama", 512, 64, 128, 2, 4, 2, 2048, 10000.0, 1e-5, false, 0, 0},
    // Awkward tensor-parallel splits: 3 KV groups of 4 heads (uneven over 2 ranks, replicated over 6), vocab 500.
    {"tiny-gqa", "llama", 500, 192, 384, 2, 12, 3, 2048, 10000.0, 1e-5, true, 0, 0},
    {"smollm2-135m", "llama", 49152, 576, 1536, 30, 9, 3, 8192, 100000.0, 1e-5, true, 0, 0},
    {"tinyllama-1.1b", "llama", 32000, 2048, 5632, 22, 32, 4, 2048, 10000.0, 1e-5, false, 0, 0},
    {"llama-2-7b", "llama", 32000, 4096, 11008, 32, 32, 32, 4096, 10000.0, 1e-5, false, 0, 0},
    {"llama-3-8b", "llama", 128256, 4096, 14336, 32, 32, 8, 8192, 500000.0, 1e-5, false, 0, 0},
    {"llama-3.1-8b", "llama", 128256, 4096, 14336, 32, 32, 8, 131072, 500000.0, 1e-5, false, 8.0, 8192},
    {"llama-3.2-1b", "llama", 128256, 2048, 8192, 16, 32, 8, 131072, 500000.0, 1e-5, true, 32.0, 8192},
    {"qwen2.5-0.5b", "qwen2", 151936, 896, 4864, 24, 14, 2, 32768, 1000000.0, 1e-6, true, 0, 0},
};

// The mixture-of-experts / latent-attention families at test sizes: each keeps its published model's structure (the
// config keys of configs/models/<name>/config.json that decide routing, attention and layer layout) and shrinks only
// the widths and counts. Hidden 64, vocab 512 (the byte-level tokenizer), 4 layers, a few MB in f32.
HfModelConfig moe_base(const char* model_type, const char* architecture) {
  HfModelConfig c;
  c.model_type = model_type;
  c.architecture = architecture;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.num_hidden_layers = 4;
  c.bos_token_id = {1};
  c.eos_token_id = {2};
  return c;
}

// DeepSeek-V3 (and R1, which shares its config): MLA with a compressed query (q_lora_rank), sigmoid routing with the
// selection-only bias, group-limited top-k (noaux_tc: 16 experts in 4 groups, the best 2 groups, top-4 of their 8),
// renormalised and scaled by 2.5, one shared expert, the first layer dense, yarn rope with mscale == mscale_all_dim
// (factor 40 over an original 128-token context, DeepSeek's ratio 163840 / 4096), and one multi-token-prediction
// layer stored after the decoder's (servetune does not run it).
HfModelConfig deepseek_v3_tiny() {
  HfModelConfig c = moe_base("deepseek_v3", "DeepseekV3ForCausalLM");
  c.intermediate_size = 128;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.mla = {.q_lora_rank = 32, .kv_lora_rank = 32, .qk_nope_head_dim = 16, .qk_rope_head_dim = 8, .v_head_dim = 16};
  c.head_dim = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim;
  c.max_position_embeddings = 5120;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.rope_scaling.type = RopeScalingType::kYarn;
  c.rope_scaling.factor = 40.0;
  c.rope_scaling.original_max_position_embeddings = 128;
  c.rope_scaling.beta_fast = 32.0;
  c.rope_scaling.beta_slow = 1.0;
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 1.0;
  HfMoeConfig& m = c.moe;
  m.num_experts = 16;
  m.num_experts_per_tok = 4;
  m.moe_intermediate_size = 32;
  m.n_shared_experts = 1;
  m.norm_topk_prob = true;
  m.routed_scaling_factor = 2.5;
  m.scoring_func = "sigmoid";
  m.topk_method = "noaux_tc";
  m.n_group = 4;
  m.topk_group = 2;
  m.first_k_dense_replace = 1;
  m.moe_layer_freq = 1;
  c.num_nextn_predict_layers = 1;
  return c;
}

// DeepSeek-V2-Lite: MLA without query compression (plain q_proj), softmax greedy top-6 of 16 (V2-Lite: of 64), not
// renormalised, routed_scaling_factor 1, two shared experts, the first layer dense, yarn with mscale ==
// mscale_all_dim == 0.707.
HfModelConfig deepseek_v2_lite_tiny() {
  HfModelConfig c = deepseek_v3_tiny();  // the same widths, layers and yarn band
  c.model_type = "deepseek_v2";
  c.architecture = "DeepseekV2ForCausalLM";
  c.mla.q_lora_rank = 0;
  c.rope_scaling.mscale = 0.707;
  c.rope_scaling.mscale_all_dim = 0.707;
  HfMoeConfig& m = c.moe;
  m.num_experts_per_tok = 6;
  m.n_shared_experts = 2;
  m.norm_topk_prob = false;
  m.routed_scaling_factor = 1.0;
  m.scoring_func = "softmax";
  m.topk_method = "greedy";
  m.n_group = 1;
  m.topk_group = 1;
  c.num_nextn_predict_layers = 0;
  return c;
}

// Qwen3-30B-A3B: every layer MoE (decoder_sparse_step 1, no mlp_only_layers), softmax top-k renormalised
// (norm_topk_prob), no shared expert, GQA 8:1 with an explicit head_dim wider than hidden / heads, per-head q/k
// RMSNorm, rope_theta 1e6.
HfModelConfig qwen3_moe_tiny() {
  HfModelConfig c = moe_base("qwen3_moe", "Qwen3MoeForCausalLM");
  c.intermediate_size = 192;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 1;
  c.head_dim = 16;  // 8 x 16 = 128 > hidden 64, as Qwen3-30B-A3B's 32 x 128 = 4096 > 2048
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.qk_norm = true;
  HfMoeConfig& m = c.moe;
  m.num_experts = 16;
  m.num_experts_per_tok = 4;
  m.moe_intermediate_size = 32;
  m.norm_topk_prob = true;
  m.decoder_sparse_step = 1;
  return c;
}

// Mixtral-8x7B: 8 experts (block_sparse_moe.experts.E.w1/w2/w3), softmax top-2 renormalised, every layer MoE, GQA
// 4:1, rope_theta 1e6, no sliding window.
HfModelConfig mixtral_tiny() {
  HfModelConfig c = moe_base("mixtral", "MixtralForCausalLM");
  c.intermediate_size = 64;  // Mixtral's expert width
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1000000.0;
  HfMoeConfig& m = c.moe;
  m.num_experts = 8;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = c.intermediate_size;
  m.norm_topk_prob = true;
  return c;
}

struct MoePreset {
  const char* name;
  HfModelConfig (*make)();
};

constexpr MoePreset kMoePresets[] = {
    {"deepseek-v3-tiny", deepseek_v3_tiny},
    {"deepseek-v2-lite-tiny", deepseek_v2_lite_tiny},
    {"qwen3-moe-tiny", qwen3_moe_tiny},
    {"mixtral-tiny", mixtral_tiny},
};

DType to_dtype(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kF16: return DType::kF16;
    case WeightDType::kBF16: return DType::kBF16;
    case WeightDType::kF32: break;
  }
  return DType::kF32;
}

RandomModelSummary write_and_summarise(const HfModelConfig& c, const std::string& dir, uint64_t seed, WeightDType dtype,
                                       float init_std) {
  write_random_model(c, dir, seed, to_dtype(dtype), init_std);
  return {c.architecture, c.num_hidden_layers, c.hidden_size, c.vocab_size};
}

}  // namespace

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& p : kPresets) n.emplace_back(p.name);
    for (const auto& p : kMoePresets) n.emplace_back(p.name);
    return n;
  }();
  return names;
}

HfModelConfig model_preset(const std::string& name) {
  for (const auto& p : kMoePresets) {
    if (name == p.name) return p.make();
  }
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    HfModelConfig c;
    c.model_type = p.model_type;
    c.architecture = c.model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.ffn;
    c.num_hidden_layers = p.layers;
    c.num_attention_heads = p.heads;
    c.num_key_value_heads = p.kv_heads;
    c.head_dim = p.hidden / p.heads;
    c.max_position_embeddings = p.context;
    c.rope_theta = p.theta;
    c.rms_norm_eps = p.eps;
    c.tie_word_embeddings = p.tied;
    c.attention_bias = c.model_type == "qwen2";
    if (p.llama3_factor > 0) {
      c.rope_scaling.type = RopeScalingType::kLlama3;
      c.rope_scaling.factor = p.llama3_factor;
      c.rope_scaling.original_max_position_embeddings = p.llama3_original_context;
    }
    c.bos_token_id = {1};
    c.eos_token_id = {2};
    return c;
  }
  std::string list;
  for (const auto& n : model_preset_names()) list += (list.empty() ? "" : ", ") + n;
  throw_usage("unknown model preset '" + name + "' (choose " + list + ")");
}

std::string byte_level_tokenizer_json() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[unicode::byte_to_unicode(static_cast<uint8_t>(b))] = 3 + b;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (int id = 0; id < 3; ++id) {
    added.push_back({{"id", id}, {"content", id == 0 ? "<unk>" : id == 1 ? "<s>" : "</s>"}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  nlohmann::ordered_json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                 {"vocab", vocab}, {"merges", nlohmann::ordered_json::array()}}},
  };
  return doc.dump(2);
}

void write_random_model(const HfModelConfig& config, const std::string& dir, uint64_t seed, DType dtype, float init_std,
                        int64_t shard_bytes) {
  namespace fs = std::filesystem;
  if (config.vocab_size < 259) throw_usage("make-model needs a vocabulary of at least 259 tokens (the byte-level tokenizer)");
  HfModelConfig c = config;
  c.torch_dtype = dtype == DType::kBF16 ? "bfloat16" : dtype == DType::kF16 ? "float16" : "float32";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_io(dir, "cannot create directory: " + ec.message());

  // Group tensors into shards of at most shard_bytes, generating one shard at a time.
  const auto specs = hf_tensor_specs(c);
  std::vector<std::vector<const RandomTensorSpec*>> shards(1);
  int64_t current = 0, total = 0;
  for (const auto& spec : specs) {
    int64_t n = dtype_info(dtype).type_size;
    for (int64_t s : spec.shape) n *= s;
    if (current > 0 && current + n > shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(&spec);
    current += n;
    total += n;
  }
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : "model-" + std::to_string(i + 1) + "-of-" + std::to_string(shards.size()) + ".safetensors";
    std::vector<std::vector<uint8_t>> buffers(shards[i].size());
    std::vector<SafetensorsWriteTensor> tensors;
    for (size_t t = 0; t < shards[i].size(); ++t) {
      fill_random_tensor(*shards[i][t], seed, init_std, dtype, buffers[t]);
      tensors.push_back({shards[i][t]->hf_name, dtype, shards[i][t]->shape, buffers[t]});
      weight_map[shards[i][t]->hf_name] = file;
    }
    write_safetensors((fs::path(dir) / file).string(), tensors, {{"format", "pt"}});
  }
  if (shards.size() > 1) write_safetensors_index((fs::path(dir) / "model.safetensors.index.json").string(), weight_map, static_cast<uint64_t>(total));
  write_hf_config((fs::path(dir) / "config.json").string(), c);
  std::ofstream tok(fs::path(dir) / "tokenizer.json");
  tok << byte_level_tokenizer_json();
  if (!tok) throw_io(dir + "/tokenizer.json", "cannot write");
}

RandomModelSummary make_random_model(const std::string& preset, const std::string& dir, uint64_t seed,
                                     WeightDType dtype, float init_std) {
  return write_and_summarise(model_preset(preset), dir, seed, dtype, init_std);
}

RandomModelSummary make_random_model(const RandomModelShape& shape, const std::string& dir, uint64_t seed,
                                     WeightDType dtype, float init_std) {
  const auto positive = [](const char* field, int64_t v) {
    if (v <= 0) {
      throw_usage("random model shape: " + std::string(field) + " must be positive, got " + std::to_string(v));
    }
  };
  positive("layers", shape.layers);
  positive("hidden", shape.hidden);
  positive("heads", shape.heads);
  positive("intermediate", shape.intermediate);
  positive("vocab", shape.vocab);
  if (shape.arch != "llama" && shape.arch != "qwen2") {
    throw_usage("random model shape: arch must be llama or qwen2, got '" + shape.arch + "'");
  }
  const int64_t kv = shape.kv_heads > 0 ? shape.kv_heads : shape.heads;
  if (shape.hidden % shape.heads != 0) throw_usage("random model shape: hidden must be a multiple of heads");
  if (shape.heads % kv != 0) throw_usage("random model shape: heads must be a multiple of kv_heads");
  HfModelConfig c;
  c.model_type = shape.arch;
  c.architecture = shape.arch == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  c.num_hidden_layers = shape.layers;
  c.hidden_size = shape.hidden;
  c.num_attention_heads = shape.heads;
  c.num_key_value_heads = kv;
  c.head_dim = shape.hidden / shape.heads;
  c.intermediate_size = shape.intermediate;
  c.vocab_size = shape.vocab;
  c.max_position_embeddings = shape.context;
  c.rope_theta = shape.rope_theta;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = shape.tie_embeddings;
  c.attention_bias = shape.arch == "qwen2";
  c.bos_token_id = {1};
  c.eos_token_id = {2};
  return write_and_summarise(c, dir, seed, dtype, init_std);
}

}  // namespace servetune
