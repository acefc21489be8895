// Checkpoint opening and GGUF hyperparameter reading.
#include "model/checkpoint.h"

#include <filesystem>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "model/hf_weights.h"
#include "model/random_weights.h"
#include "tokenizer/tokenizer.h"
#include "model/llama.h"
#include "model/moe_decoder.h"
#include "model/weight_loader.h"
#include "model/weight_source.h"

namespace servetune {
namespace {

constexpr const char* kSupportedArchitectures = "llama, qwen2";

}  // namespace

ModelConfig read_gguf_config(const GgufFile& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch) throw_format(f.path(), "missing metadata 'general.architecture'");
  c.architecture = *arch;
  if (c.architecture != "llama" && c.architecture != "qwen2") {
    throw_unsupported(f.path() + ": architecture '" + c.architecture + "' is not supported (supported: " + kSupportedArchitectures + ")");
  }
  const std::string a = c.architecture + ".";
  auto require_int = [&](const std::string& key) {
    auto v = f.get_int(key);
    if (!v) throw_format(f.path(), "missing metadata '" + key + "'");
    return *v;
  };
  c.n_layers = require_int(a + "block_count");
  c.hidden = require_int(a + "embedding_length");
  c.ffn = require_int(a + "feed_forward_length");
  c.n_heads = require_int(a + "attention.head_count");
  c.n_kv_heads = f.get_int(a + "attention.head_count_kv").value_or(c.n_heads);
  c.head_dim = f.get_int(a + "attention.key_length").value_or(c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.context_length = require_int(a + "context_length");
  c.rms_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_theta = static_cast<float>(f.get_float(a + "rope.freq_base").value_or(10000.0));
  c.rope_dim = f.get_int(a + "rope.dimension_count").value_or(c.head_dim);
  c.rope_neox = c.architecture == "qwen2";
  c.attention_bias = c.architecture == "qwen2";
  std::string scaling = f.get_string(a + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope_scaling = RopeKind::kLinear;
    c.rope_factor = static_cast<float>(f.get_float(a + "rope.scaling.factor").value_or(1.0));
  } else if (scaling != "none") {
    throw_unsupported(f.path() + ": rope scaling '" + scaling + "' is not supported (supported: none, linear, llama3 via rope_freqs)");
  }
  if (auto v = f.get_int(a + "vocab_size")) {
    c.vocab = *v;
  } else if (const GgufValue* tokens = f.find("tokenizer.ggml.tokens")) {
    c.vocab = static_cast<int64_t>(tokens->size());
  } else if (const GgufTensorInfo* emb = f.tensor("token_embd.weight"); emb && emb->dims.size() == 2) {
    c.vocab = emb->dims[1];
  }
  c.tied_embeddings = f.tensor("output.weight") == nullptr;
  validate_model_config(c, f.path());
  return c;
}

Checkpoint::Checkpoint(const std::string& path, LoadFormat format, uint64_t seed) : path_(path), format_(format) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  if (format_ == LoadFormat::kAuto) format_ = is_dir ? LoadFormat::kSafetensors : LoadFormat::kGguf;
  if (format_ != LoadFormat::kGguf) {
    dir_ = is_dir ? path : fs::path(path).parent_path().string();
    if (dir_.empty()) dir_ = ".";
  }
  switch (format_) {
    case LoadFormat::kGguf:
      gguf_ = std::make_unique<GgufFile>(path);
      config_ = read_gguf_config(*gguf_);
      source_ = std::make_unique<GgufWeightSource>(*gguf_);
      break;
    case LoadFormat::kSafetensors: {
      HfModelConfig hf = read_hf_config(dir_);
      config_ = model_config_from_hf(hf, dir_ + "/config.json");
      safetensors_ = std::make_unique<SafetensorsSet>(path);
      source_ = std::make_unique<SafetensorsWeightSource>(*safetensors_, path, hf.tie_word_embeddings, hf.model_type);
      break;
    }
    case LoadFormat::kDummy: {
      HfModelConfig hf = read_hf_config(is_dir ? path : path);
      config_ = model_config_from_hf(hf, path);
      DType dtype = DType::kF32;
      if (hf.torch_dtype == "bfloat16") dtype = DType::kBF16;
      if (hf.torch_dtype == "float16") dtype = DType::kF16;
      source_ = std::make_unique<RandomWeightSource>(hf, path + " (dummy weights)", seed, 0.02f, dtype);
      break;
    }
    case LoadFormat::kAuto:
      break;
  }
}

Checkpoint::~Checkpoint() = default;

std::unique_ptr<Model> Checkpoint::load(Backend& backend, ParallelContext parallel, CompileOptions compile) const {
  WeightLoader loader(*source_, backend, parallel);
  if (config_.is_moe() || config_.is_mla()) return std::make_unique<MoeDecoderModel>(config_, loader, backend, parallel, compile);
  return std::make_unique<LlamaModel>(config_, loader, backend, parallel, compile);
}

std::unique_ptr<Tokenizer> Checkpoint::load_tokenizer() const {
  if (gguf_) return Tokenizer::from_gguf(*gguf_);
  if (!std::filesystem::exists(std::filesystem::path(dir_) / "tokenizer.json")) {
    throw_format(dir_, "no tokenizer.json next to the model (servetune make-model writes one)");
  }
  return Tokenizer::from_hf_dir(dir_);
}

}  // namespace servetune
