// config.json parsing and writing for the supported decoder families. Defaults are transformers' (5.x, which also reads the
// 4.x keys rope_theta / rope_scaling / torch_dtype); the shape keys have no default here: a config without
// them is rejected rather than silently becoming a 7B model.
#include "formats/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace servetune {
namespace {

using nlohmann::json;

struct ArchDefaults {
  std::string_view architecture, model_type;
  int64_t max_position_embeddings;
  std::optional<int64_t> bos, eos;
  std::optional<int64_t> sliding_window;  // default when the key is absent
};

constexpr ArchDefaults kArchs[] = {
    {"LlamaForCausalLM", "llama", 2048, 1, 2, std::nullopt},
    {"MistralForCausalLM", "mistral", 131072, 1, 2, 4096},
    {"Qwen2ForCausalLM", "qwen2", 32768, std::nullopt, std::nullopt, std::nullopt},
    {"MixtralForCausalLM", "mixtral", 131072, 1, 2, std::nullopt},
    {"Qwen2MoeForCausalLM", "qwen2_moe", 32768, std::nullopt, std::nullopt, std::nullopt},
    {"Qwen3MoeForCausalLM", "qwen3_moe", 32768, std::nullopt, std::nullopt, std::nullopt},
    {"DeepseekV2ForCausalLM", "deepseek_v2", 2048, 100000, 100001, std::nullopt},
    {"DeepseekV3ForCausalLM", "deepseek_v3", 4096, 0, 1, std::nullopt},
};

bool is_deepseek(std::string_view model_type) { return model_type == "deepseek_v2" || model_type == "deepseek_v3"; }

std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + text;
}

// Typed access to one JSON object with errors naming the file and key.
class Reader {
 public:
  Reader(const json& obj, const std::string& file, std::string prefix = "")
      : obj_(obj), file_(file), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    throw_format(file_, "key '" + prefix_ + std::string(key) + "' " + what);
  }
  // Present and not null.
  const json* find(std::string_view key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<int64_t> opt_int(std::string_view key, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) fail(key, "must be an integer, got " + describe(*v));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) fail(key, out_of_range(*v, lo, hi));
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) fail(key, out_of_range(*v, lo, hi));
    return x;
  }
  int64_t req_int(std::string_view key, int64_t lo, int64_t hi) const {
    if (find(key) == nullptr) fail(key, "is missing (required)");
    return *opt_int(key, lo, hi);
  }
  std::optional<double> opt_float(std::string_view key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) fail(key, "must be a number, got " + describe(*v));
    return v->get<double>();
  }
  // A positive finite number (and below `hi`).
  double positive(std::string_view key, double fallback, double hi = std::numeric_limits<double>::max()) const {
    const double x = opt_float(key).value_or(fallback);
    if (!(x > 0.0) || !(x < hi)) {
      std::ostringstream what;
      what << "must be positive" << (hi < std::numeric_limits<double>::max() ? " and below " : "");
      if (hi < std::numeric_limits<double>::max()) what << hi;
      what << ", got " << x;
      fail(key, what.str());
    }
    return x;
  }
  bool opt_bool(std::string_view key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, "must be true or false, got " + describe(*v));
    return v->get<bool>();
  }
  std::optional<std::string> opt_string(std::string_view key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) fail(key, "must be a string, got " + describe(*v));
    return v->get<std::string>();
  }
  // An int, a list of ints, or null/absent (-> fallback).
  std::vector<int64_t> token_ids(std::string_view key, std::optional<int64_t> fallback) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return fallback ? std::vector<int64_t>{*fallback} : std::vector<int64_t>{};
    if (it->is_null()) return {};
    const json items = it->is_array() ? *it : json::array({*it});
    std::vector<int64_t> ids;
    for (const json& id : items) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          (id.is_number_unsigned() &&
           id.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
        fail(key, "must be a non-negative token id or a list of them, got " + describe(*it));
      }
      ids.push_back(id.get<int64_t>());
    }
    return ids;
  }

 private:
  static std::string out_of_range(const json& v, int64_t lo, int64_t hi) {
    return "is " + v.dump() + ", outside the sensible range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
  const json& obj_;
  const std::string& file_;
  std::string prefix_;
};

const ArchDefaults& find_arch(const json& config, const std::string& file) {
  std::string supported;
  for (const ArchDefaults& a : kArchs) supported += (supported.empty() ? "" : ", ") + std::string(a.architecture);
  auto archs = config.find("architectures");
  if (archs != config.end() && !archs->is_null()) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      throw_format(file, "key 'architectures' must be a non-empty list of strings, got " + describe(*archs));
    }
    const std::string name = (*archs)[0].get<std::string>();
    if (name == kEagleHeadArchitecture) return kArchs[0];  // a llama-family EAGLE draft head (eagle_head set below)
    for (const ArchDefaults& a : kArchs) {
      if (a.architecture == name) return a;
    }
    throw_unsupported(file + ": architecture " + name + " is not supported (supported: " + supported + ")");
  }
  auto type = config.find("model_type");
  if (type == config.end() || !type->is_string()) {
    throw_format(file, "neither 'architectures' nor 'model_type' says which model this is");
  }
  for (const ArchDefaults& a : kArchs) {
    if (a.model_type == type->get<std::string>()) return a;
  }
  throw_unsupported(file + ": model_type " + type->get<std::string>() + " is not supported (supported: " + supported +
                    ")");
}

// rope_parameters (transformers 5) or rope_theta + rope_scaling (4.x). Sets theta and scaling.
void parse_rope(const Reader& top, const std::string& file, HfModelConfig& c) {
  const json* params = top.find("rope_parameters");
  const json* scaling = params != nullptr ? params : top.find("rope_scaling");
  c.rope_theta = top.positive("rope_theta", 10000.0);
  if (scaling == nullptr) return;
  const std::string key = params != nullptr ? "rope_parameters" : "rope_scaling";
  if (!scaling->is_object())
    throw_format(file, "key '" + key + "' must be an object or null, got " + describe(*scaling));
  const Reader r(*scaling, file, key + ".");
  if (params != nullptr) c.rope_theta = r.positive("rope_theta", c.rope_theta);
  std::optional<std::string> type = r.opt_string("rope_type");
  if (!type) type = r.opt_string("type");
  if (!type || *type == "default") return;
  if (*type == "linear") {
    c.rope_scaling.type = RopeScalingType::kLinear;
    if (r.find("factor") == nullptr) r.fail("factor", "is missing (required for linear rope scaling)");
    c.rope_scaling.factor = r.positive("factor", 1.0);
  } else if (*type == "llama3") {
    c.rope_scaling.type = RopeScalingType::kLlama3;
    for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (r.find(k) == nullptr) r.fail(k, "is missing (required for llama3 rope scaling)");
    }
    c.rope_scaling.factor = r.positive("factor", 1.0);
    c.rope_scaling.low_freq_factor = r.positive("low_freq_factor", 1.0);
    c.rope_scaling.high_freq_factor = r.positive("high_freq_factor", 4.0);
    c.rope_scaling.original_max_position_embeddings =
        r.req_int("original_max_position_embeddings", 1, int64_t{1} << 34);
    if (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor) {
      r.fail("high_freq_factor", "must be greater than low_freq_factor");
    }
  } else if (*type == "yarn") {
    c.rope_scaling.type = RopeScalingType::kYarn;
    for (const char* k : {"factor", "original_max_position_embeddings"}) {
      if (r.find(k) == nullptr) r.fail(k, "is missing (required for yarn rope scaling)");
    }
    c.rope_scaling.factor = r.positive("factor", 1.0);
    c.rope_scaling.original_max_position_embeddings =
        r.req_int("original_max_position_embeddings", 1, int64_t{1} << 34);
    c.rope_scaling.beta_fast = r.positive("beta_fast", 32.0);
    c.rope_scaling.beta_slow = r.positive("beta_slow", 1.0);
    if (c.rope_scaling.beta_fast <= c.rope_scaling.beta_slow) r.fail("beta_fast", "must be greater than beta_slow");
    c.rope_scaling.mscale = r.opt_float("mscale").value_or(0.0);
    c.rope_scaling.mscale_all_dim = r.opt_float("mscale_all_dim").value_or(0.0);
    if (r.find("attention_factor") != nullptr) {
      throw_unsupported(file + ": yarn rope scaling with an explicit attention_factor is not supported");
    }
  } else {
    throw_unsupported(file + ": rope scaling type '" + *type +
                      "' is not supported (supported: default, linear, llama3, yarn)");
  }
}


// Multi-head latent attention dimensions (deepseek); q_lora_rank null or absent means no query compression.
void parse_mla(const Reader& r, HfModelConfig& c) {
  c.mla.q_lora_rank = r.opt_int("q_lora_rank", 1, int64_t{1} << 20).value_or(0);
  c.mla.kv_lora_rank = r.req_int("kv_lora_rank", 1, int64_t{1} << 20);
  c.mla.qk_nope_head_dim = r.req_int("qk_nope_head_dim", 1, int64_t{1} << 14);
  c.mla.qk_rope_head_dim = r.req_int("qk_rope_head_dim", 2, int64_t{1} << 14);
  c.mla.v_head_dim = r.req_int("v_head_dim", 1, int64_t{1} << 14);
  if (c.mla.qk_rope_head_dim % 2 != 0) {
    r.fail("qk_rope_head_dim", "(" + std::to_string(c.mla.qk_rope_head_dim) + ") must be even for rotary embeddings");
  }
}

// The family's mixture-of-experts keys into the common fields; a dense family leaves them empty. The expert count,
// top-k and expert width are shape keys: required, like hidden_size.
void parse_moe(const Reader& r, HfModelConfig& c) {
  HfMoeConfig& m = c.moe;
  const std::string& t = c.model_type;
  constexpr int64_t kMaxExperts = 1 << 16;
  if (t == "mixtral") {
    m.num_experts = r.req_int("num_local_experts", 1, kMaxExperts);
    m.num_experts_per_tok = r.req_int("num_experts_per_tok", 1, kMaxExperts);
    m.moe_intermediate_size = c.intermediate_size;
    m.norm_topk_prob = true;  // softmax over the chosen experts' logits
  } else if (t == "qwen2_moe" || t == "qwen3_moe") {
    // Published configs say num_experts; transformers 5 writes num_local_experts.
    m.num_experts = r.find("num_experts") != nullptr || r.find("num_local_experts") == nullptr
                        ? r.req_int("num_experts", 1, kMaxExperts)
                        : r.req_int("num_local_experts", 1, kMaxExperts);
    m.num_experts_per_tok = r.req_int("num_experts_per_tok", 1, kMaxExperts);
    m.moe_intermediate_size = r.req_int("moe_intermediate_size", 1, int64_t{1} << 24);
    m.norm_topk_prob = r.opt_bool("norm_topk_prob", false);
    m.decoder_sparse_step = r.opt_int("decoder_sparse_step", 1, 100000).value_or(1);
    if (t == "qwen2_moe") {
      m.shared_expert_intermediate_size = r.req_int("shared_expert_intermediate_size", 1, int64_t{1} << 24);
    }
    if (const nlohmann::json* dense = r.find("mlp_only_layers")) {
      if (!dense->is_array()) r.fail("mlp_only_layers", "must be a list of layer indices, got " + describe(*dense));
      for (const nlohmann::json& l : *dense) {
        if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c.num_hidden_layers) {
          r.fail("mlp_only_layers", "must hold layer indices below num_hidden_layers (" +
                                        std::to_string(c.num_hidden_layers) + "), got " + describe(l));
        }
        m.mlp_only_layers.push_back(l.get<int64_t>());
      }
    }
  } else if (is_deepseek(t)) {
    m.num_experts = r.req_int("n_routed_experts", 1, kMaxExperts);
    m.num_experts_per_tok = r.req_int("num_experts_per_tok", 1, kMaxExperts);
    m.moe_intermediate_size = r.req_int("moe_intermediate_size", 1, int64_t{1} << 24);
    m.n_shared_experts = r.opt_int("n_shared_experts", 0, kMaxExperts).value_or(0);
    m.routed_scaling_factor = r.positive("routed_scaling_factor", 1.0);
    m.norm_topk_prob = r.opt_bool("norm_topk_prob", t == "deepseek_v3");
    m.scoring_func = r.opt_string("scoring_func").value_or(t == "deepseek_v3" ? "sigmoid" : "softmax");
    m.topk_method = r.opt_string("topk_method").value_or(t == "deepseek_v3" ? "noaux_tc" : "greedy");
    m.n_group = r.opt_int("n_group", 1, kMaxExperts).value_or(1);
    m.topk_group = r.opt_int("topk_group", 1, kMaxExperts).value_or(1);
    m.first_k_dense_replace = r.opt_int("first_k_dense_replace", 0, c.num_hidden_layers).value_or(0);
    m.moe_layer_freq = r.opt_int("moe_layer_freq", 1, 100000).value_or(1);
    if (m.scoring_func != "softmax" && m.scoring_func != "sigmoid") {
      r.fail("scoring_func", "must be \"softmax\" or \"sigmoid\", got \"" + m.scoring_func + "\"");
    }
    if (m.topk_method != "greedy" && m.topk_method != "group_limited_greedy" && m.topk_method != "noaux_tc") {
      r.fail("topk_method", "must be \"greedy\", \"group_limited_greedy\" or \"noaux_tc\", got \"" + m.topk_method + "\"");
    }
  } else {
    return;
  }
  if (m.num_experts_per_tok > m.num_experts) {
    r.fail("num_experts_per_tok", "(" + std::to_string(m.num_experts_per_tok) + ") exceeds the number of experts (" +
                                      std::to_string(m.num_experts) + ")");
  }
  if (m.num_experts % m.n_group != 0) {
    r.fail("n_group", "(" + std::to_string(m.n_group) + ") must divide the number of experts (" +
                          std::to_string(m.num_experts) + ")");
  }
  if (m.topk_group > m.n_group) {
    r.fail("topk_group", "(" + std::to_string(m.topk_group) + ") exceeds n_group (" + std::to_string(m.n_group) + ")");
  }
  if (m.n_group > 1 && m.num_experts_per_tok > m.topk_group * (m.num_experts / m.n_group)) {
    r.fail("num_experts_per_tok", "(" + std::to_string(m.num_experts_per_tok) + ") exceeds the experts in topk_group (" +
                                      std::to_string(m.topk_group) + ") groups of " +
                                      std::to_string(m.num_experts / m.n_group));
  }
}

// quantization_config: only FP8 E4M3 weights in 128x128 blocks with dynamic activation scales (see HfQuantization).
std::optional<HfQuantization> parse_quantization(const Reader& top, const std::string& file) {
  const json* q = top.find("quantization_config");
  if (q == nullptr) return std::nullopt;
  if (!q->is_object()) throw_format(file, "key 'quantization_config' must be an object or null, got " + describe(*q));
  const Reader r(*q, file, "quantization_config.");
  HfQuantization out;
  const auto unsupported = [&](const std::string& what) {
    throw_unsupported(file + ": quantization_config " + what +
                      " is not supported (servetune reads FP8 E4M3 weights with 128x128 block scales and dynamic "
                      "activation scales, as DeepSeek-V3 ships them; GGUF files for other quantizations)");
  };
  out.quant_method = r.opt_string("quant_method").value_or("");
  if (out.quant_method != "fp8") unsupported("quant_method '" + out.quant_method + "'");
  out.fmt = r.opt_string("fmt").value_or(out.fmt);
  if (out.fmt != "e4m3") unsupported("fmt '" + out.fmt + "'");
  out.activation_scheme = r.opt_string("activation_scheme").value_or(out.activation_scheme);
  if (out.activation_scheme != "dynamic") unsupported("activation_scheme '" + out.activation_scheme + "'");
  const json* block = r.find("weight_block_size");
  if (block == nullptr) unsupported("without weight_block_size (per-tensor FP8 scales)");
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() || !(*block)[1].is_number_integer()) {
    r.fail("weight_block_size", "must be two integers, got " + describe(*block));
  }
  out.weight_block_size = {(*block)[0].get<int64_t>(), (*block)[1].get<int64_t>()};
  if (out.weight_block_size != std::vector<int64_t>{128, 128}) unsupported("weight_block_size " + block->dump());
  return out;
}

}  // namespace

const std::vector<std::string>& supported_hf_architectures() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> v;
    for (const ArchDefaults& a : kArchs) v.emplace_back(a.architecture);
    return v;
  }();
  return kNames;
}

HfModelConfig parse_hf_config(std::string_view json_text, const std::string& name) {
  json config;
  try {
    config = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    std::string what = e.what();  // drop nlohmann's "[json.exception.parse_error.101] " prefix
    if (const size_t close = what.find("] "); what.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
      what = what.substr(close + 2);
    }
    throw_format(name, "not valid JSON: " + what);
  }
  if (!config.is_object()) throw_format(name, "config is not a JSON object");
  const ArchDefaults& arch = find_arch(config, name);
  const Reader r(config, name);
  HfModelConfig c;
  c.architecture = arch.architecture;
  c.model_type = arch.model_type;
  if (const auto archs = config.find("architectures"); archs != config.end() && archs->is_array()) {
    c.eagle_head = (*archs)[0].is_string() && (*archs)[0].get<std::string>() == kEagleHeadArchitecture;
  }

  c.hidden_size = r.req_int("hidden_size", 1, int64_t{1} << 20);
  c.intermediate_size = r.req_int("intermediate_size", 1, int64_t{1} << 24);
  c.num_hidden_layers = r.req_int("num_hidden_layers", 1, 100000);
  c.num_attention_heads = r.req_int("num_attention_heads", 1, int64_t{1} << 14);
  c.num_key_value_heads = r.opt_int("num_key_value_heads", 1, c.num_attention_heads).value_or(c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    r.fail("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) + ") must divide num_attention_heads (" +
                                      std::to_string(c.num_attention_heads) + ")");
  }
  if (is_deepseek(c.model_type)) {
    parse_mla(r, c);
    c.head_dim = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim;  // the query/key width of one head
  } else if (auto hd = r.opt_int("head_dim", 1, int64_t{1} << 14)) {
    c.head_dim = *hd;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      r.fail("num_attention_heads", "(" + std::to_string(c.num_attention_heads) + ") must divide hidden_size (" +
                                        std::to_string(c.hidden_size) + ") when head_dim is absent");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0)
    r.fail("head_dim", "(" + std::to_string(c.head_dim) + ") must be even for rotary embeddings");
  c.vocab_size = r.req_int("vocab_size", 1, int64_t{1} << 28);
  c.max_position_embeddings =
      r.opt_int("max_position_embeddings", 1, int64_t{1} << 34).value_or(arch.max_position_embeddings);
  c.rms_norm_eps = r.positive("rms_norm_eps", 1e-6, 1.0);
  parse_rope(r, name, c);

  const std::string act = r.opt_string("hidden_act").value_or("silu");
  if (act != "silu")
    throw_unsupported(name + ": hidden_act '" + act + "' is not supported (the llama family uses silu)");
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  if (c.model_type == "qwen2" || c.model_type == "qwen2_moe") {
    c.attention_bias = true;  // Qwen2 always has q/k/v biases (and none on o_proj)
    if (r.opt_bool("use_sliding_window", false)) {
      throw_unsupported(name + ": Qwen2 sliding-window attention (use_sliding_window: true) is not supported");
    }
  } else if (c.model_type == "qwen3_moe") {
    c.attention_bias = r.opt_bool("attention_bias", false);
    c.qk_norm = true;
    if (r.opt_bool("use_sliding_window", false)) {
      throw_unsupported(name + ": Qwen3 sliding-window attention (use_sliding_window: true) is not supported");
    }
  } else {
    c.attention_bias = r.opt_bool("attention_bias", false);
    if (c.model_type == "mistral" || c.model_type == "mixtral") {
      c.sliding_window =
          config.contains("sliding_window") ? r.opt_int("sliding_window", 1, int64_t{1} << 34) : arch.sliding_window;
    }
  }
  parse_moe(r, c);
  if (c.model_type == "deepseek_v3") c.num_nextn_predict_layers = r.opt_int("num_nextn_predict_layers", 0, 64).value_or(0);
  if (c.model_type == "llama") c.mlp_bias = r.opt_bool("mlp_bias", false);
  c.torch_dtype = r.opt_string("torch_dtype").value_or(r.opt_string("dtype").value_or(""));
  c.bos_token_id = r.token_ids("bos_token_id", arch.bos);
  c.eos_token_id = r.token_ids("eos_token_id", arch.eos);
  c.quantization = parse_quantization(r, name);
  return c;
}

HfModelConfig read_hf_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw_io(file, "cannot open");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw_io(file, "cannot read");
  return parse_hf_config(text.str(), file);
}

std::string hf_config_json(const HfModelConfig& c) {
  json j;  // std::map keys: sorted, as transformers writes them
  j["architectures"] = {c.architecture};
  j["model_type"] = c.model_type;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  switch (c.rope_scaling.type) {
    case RopeScalingType::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScalingType::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScalingType::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;    case RopeScalingType::kYarn:
      j["rope_scaling"] = {{"rope_type", "yarn"},
                           {"factor", c.rope_scaling.factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
                           {"beta_fast", c.rope_scaling.beta_fast},
                           {"beta_slow", c.rope_scaling.beta_slow}};
      if (c.rope_scaling.mscale != 0.0) j["rope_scaling"]["mscale"] = c.rope_scaling.mscale;
      if (c.rope_scaling.mscale_all_dim != 0.0) j["rope_scaling"]["mscale_all_dim"] = c.rope_scaling.mscale_all_dim;
      break;
  }
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe";
  if (qwen) j["use_sliding_window"] = false;
  if (c.model_type != "qwen2" && c.model_type != "qwen2_moe") j["attention_bias"] = c.attention_bias;
  if (c.model_type == "llama") j["mlp_bias"] = c.mlp_bias;
  if (c.model_type == "mistral" || c.model_type == "mixtral") {
    j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  }
  const HfMoeConfig& m = c.moe;
  if (c.model_type == "mixtral") {
    j["num_local_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.num_experts_per_tok;
  } else if (c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe") {
    j["num_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.num_experts_per_tok;
    j["moe_intermediate_size"] = m.moe_intermediate_size;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["decoder_sparse_step"] = m.decoder_sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
    if (c.model_type == "qwen2_moe") j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
  } else if (is_deepseek(c.model_type)) {
    j["n_routed_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.num_experts_per_tok;
    j["moe_intermediate_size"] = m.moe_intermediate_size;
    j["n_shared_experts"] = m.n_shared_experts;
    j["routed_scaling_factor"] = m.routed_scaling_factor;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["scoring_func"] = m.scoring_func;
    j["topk_method"] = m.topk_method;
    j["n_group"] = m.n_group;
    j["topk_group"] = m.topk_group;
    j["first_k_dense_replace"] = m.first_k_dense_replace;
    j["moe_layer_freq"] = m.moe_layer_freq;
    j["q_lora_rank"] = c.mla.q_lora_rank > 0 ? json(c.mla.q_lora_rank) : json(nullptr);
    j["kv_lora_rank"] = c.mla.kv_lora_rank;
    j["qk_nope_head_dim"] = c.mla.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.mla.qk_rope_head_dim;
    j["v_head_dim"] = c.mla.v_head_dim;
    j.erase("head_dim");  // derived from the MLA dimensions
    if (c.model_type == "deepseek_v3") j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  }
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  auto ids = [](const std::vector<int64_t>& v) {
    return v.empty() ? json(nullptr) : v.size() == 1 ? json(v[0]) : json(v);
  };
  j["bos_token_id"] = ids(c.bos_token_id);
  j["eos_token_id"] = ids(c.eos_token_id);
  if (c.quantization) {
    j["quantization_config"] = {{"quant_method", c.quantization->quant_method},
                                {"fmt", c.quantization->fmt},
                                {"activation_scheme", c.quantization->activation_scheme},
                                {"weight_block_size", c.quantization->weight_block_size}};
  }
  return j.dump(2) + "\n";
}

void write_hf_config(const std::string& path, const HfModelConfig& config) {
  const std::string text = hf_config_json(config);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw_io(path, "cannot write");
}

}  // namespace servetune
