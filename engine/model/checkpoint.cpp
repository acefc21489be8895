// Checkpoint opening (GGUF hyperparameters: gguf_config.cpp).
#include "model/checkpoint.h"

#include <filesystem>

#include "core/error.h"
#include "core/host_memory.h"
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
#include "servetune/model_info.h"

namespace servetune {
namespace {

void refuse_draft_head(const HfModelConfig& hf, const std::string& path) {
  if (!hf.eagle_head) return;
  throw_usage(path + " is an EAGLE draft head (" + std::string(kEagleHeadArchitecture) + "), not a model: give it as "
              "--speculative-draft-model with --speculative-algorithm EAGLE and its target as --model");
}

}  // namespace

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
      for (const GgufTensorInfo& t : gguf_->tensors()) weight_bytes_ += t.n_bytes;
      break;
    case LoadFormat::kSafetensors: {
      HfModelConfig hf = read_hf_config(dir_);
      refuse_draft_head(hf, dir_);
      config_ = model_config_from_hf(hf, dir_ + "/config.json");
      safetensors_ = std::make_unique<SafetensorsSet>(path);
      source_ = std::make_unique<SafetensorsWeightSource>(*safetensors_, path, hf.tie_word_embeddings, hf.model_type);
      for (const SafetensorsFile& file : safetensors_->files()) {
        for (const SafetensorsTensor& t : file.tensors()) weight_bytes_ += static_cast<int64_t>(t.data.size());
      }
      break;
    }
    case LoadFormat::kDummy: {
      HfModelConfig hf = read_hf_config(is_dir ? path : path);
      refuse_draft_head(hf, path);
      config_ = model_config_from_hf(hf, path);
      DType dtype = DType::kF32;
      if (hf.torch_dtype == "bfloat16") dtype = DType::kBF16;
      if (hf.torch_dtype == "float16") dtype = DType::kF16;
      auto random = std::make_unique<RandomWeightSource>(hf, path + " (dummy weights)", seed, 0.02f, dtype);
      weight_bytes_ = random->total_bytes();
      source_ = std::move(random);
      break;
    }
    case LoadFormat::kAuto:
      break;
  }
}

Checkpoint::~Checkpoint() = default;

int64_t Checkpoint::dummy_host_bytes() const {
  const auto* random = format_ == LoadFormat::kDummy ? dynamic_cast<const RandomWeightSource*>(source_.get()) : nullptr;
  return random ? random->host_bytes() : 0;
}

void Checkpoint::check_dummy_fits(const Backend& backend) const {
  // Random weights are generated whole (every rank's shard is cut from them): all of them must fit.
  const std::optional<DeviceMemory> device = backend.device_memory();
  const int64_t available = device ? device->free : available_host_memory();
  if (available <= 0 || weight_bytes_ <= available) return;
  const ModelInfo info = model_info_of(config_);
  throw_usage(path_ + ": random weights of this config take " + format_bytes(static_cast<double>(weight_bytes_)) +
              " (and its KV cache " + format_bytes(static_cast<double>(info.kv_values_per_token) * 2) +
              " per token in f16), but the " + backend.name() + " backend has " +
              format_bytes(static_cast<double>(available)) + " available");
}

std::unique_ptr<Model> Checkpoint::load(Backend& backend, ParallelContext parallel, CompileOptions compile) const {
  if (format_ == LoadFormat::kDummy) check_dummy_fits(backend);
  WeightLoader loader(*source_, backend, parallel);
  if (config_.is_moe() || config_.is_mla()) return std::make_unique<MoeDecoderModel>(config_, loader, backend, parallel, compile);
  return std::make_unique<LlamaModel>(config_, loader, backend, parallel, compile);
}

std::unique_ptr<Model> Checkpoint::load_next_n(Backend& backend, int64_t nextn, std::span<const int32_t> draft_vocab,
                                               bool quantize_q8_0) const {
  if (config_.nextn_layers == 0 || !config_.is_mla()) {
    throw_usage(path_ + " has no multi-token-prediction layer (DeepSeek-V3's num_nextn_predict_layers with its "
                        "model.layers.N.* tensors), which speculative_algorithm mtp / EAGLE without a draft model runs");
  }
  WeightLoader loader(*source_, backend, ParallelContext{});
  if (quantize_q8_0) loader.quantize_float_matrices(DType::kQ8_0);
  return MoeDecoderModel::next_n(config_, nextn, loader, backend, draft_vocab);
}

std::unique_ptr<Tokenizer> Checkpoint::load_tokenizer() const {
  if (gguf_) return Tokenizer::from_gguf(*gguf_);
  if (!std::filesystem::exists(std::filesystem::path(dir_) / "tokenizer.json")) {
    throw_format(dir_, "no tokenizer.json next to the model (servetune make-model writes one)");
  }
  return Tokenizer::from_hf_dir(dir_);
}

}  // namespace servetune
