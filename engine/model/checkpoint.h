// Opens a model checkpoint — a .gguf file, a directory (or config.json) with safetensors, or random weights of a
// config.json's shape (`dummy`) — and builds the model, its config and its tokenizer from it. The Checkpoint owns
// the memory maps and generated tensors the weights are used from, so it must outlive the model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/parallel.h"
#include "servetune/engine_setting_enums.h"  // LoadFormat

namespace servetune {

class GgufFile;
class SafetensorsSet;
class Tokenizer;
class WeightSource;

class Checkpoint {
 public:
  // `seed` seeds dummy weights.
  Checkpoint(const std::string& path, LoadFormat format, uint64_t seed = 0);
  ~Checkpoint();

  const std::string& path() const { return path_; }
  LoadFormat format() const { return format_; }
  const ModelConfig& config() const { return config_; }
  // Bytes of every weight as stored: the files' tensors, or for dummy weights what generating them takes.
  int64_t weight_bytes() const { return weight_bytes_; }
  // Dummy weights: the bytes generated on the host so far (0 for other formats). A device backend draws its
  // matrices in place, so only vectors (norms, biases) should count here.
  int64_t dummy_host_bytes() const;

  std::unique_ptr<Model> load(Backend& backend, ParallelContext parallel, CompileOptions compile = {}) const;
  // The model's multi-token-prediction layer `nextn` (DeepSeek-V3's next-n layers) as a one-rank draft head on
  // `backend` (model/moe_decoder.h), scoring `draft_vocab` only when given, its float matrices as Q8_0 with
  // `quantize_q8_0`. Error(kUsage) naming the file when the model has none.
  std::unique_ptr<Model> load_next_n(Backend& backend, int64_t nextn = 0, std::span<const int32_t> draft_vocab = {},
                                     bool quantize_q8_0 = false) const;
  std::unique_ptr<Tokenizer> load_tokenizer() const;
  // The checkpoint's tensors (an EAGLE head shares the target's embedding and output head).
  const WeightSource& weights() const { return *source_; }

 private:
  // Dummy weights that would not fit in the backend's free memory: Error(kUsage) saying how much they need.
  void check_dummy_fits(const Backend& backend) const;

  std::string path_;
  std::string dir_;  // directory holding config.json / tokenizer.json (HF and dummy)
  LoadFormat format_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<SafetensorsSet> safetensors_;
  std::unique_ptr<WeightSource> source_;
  ModelConfig config_;
  int64_t weight_bytes_ = 0;
};

// Reads hyperparameters from GGUF metadata as llama.cpp writes it (llama, qwen2, and the mixture-of-experts /
// latent-attention families qwen2moe, qwen3moe, deepseek2, llama with experts); Error(kUnsupported) lists the
// supported architectures, Error(kFormat) names a missing or inconsistent key. Defined in gguf_config.cpp.
ModelConfig read_gguf_config(const GgufFile& file);

}  // namespace servetune
