// Deterministic random weights for a llama-family config: the same (config, seed) gives the same tensors on every
// machine. Used by `--load-format dummy` (in memory) and `servetune make-model` (written to safetensors).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/hf_config.h"
#include "model/weight_source.h"

namespace servetune {

struct RandomTensorSpec {
  std::string hf_name;
  std::vector<int64_t> shape;
  bool is_norm = false;  // RMSNorm weights are 1 + noise, everything else N(0, std)
};

// Every tensor an HF checkpoint of `config` holds, in a stable order (DeepSeek-V3's multi-token-prediction layers,
// num_nextn_predict_layers of them after the decoder's, included).
std::vector<RandomTensorSpec> hf_tensor_specs(const HfModelConfig& config);

// Fills `out` (n_elements values of `dtype`: f32, f16 or bf16) with the tensor's random values.
void fill_random_tensor(const RandomTensorSpec& spec, uint64_t seed, float init_std, DType dtype, std::vector<uint8_t>& out);

// Random weights generated on first use and kept in memory, under GGUF names (as SafetensorsWeightSource maps them).
class RandomWeightSource final : public WeightSource {
 public:
  RandomWeightSource(const HfModelConfig& config, std::string path, uint64_t seed, float init_std, DType dtype);
  const std::string& path() const override { return path_; }
  std::optional<TensorRef> find(const std::string& name) const override;
  std::optional<RandomRecipe> random_recipe(const std::string& name) const override;
  // Bytes every tensor takes once generated.
  int64_t total_bytes() const { return total_bytes_; }
  // Bytes generated on the host so far (find); device backends draw their matrices in place instead.
  int64_t host_bytes() const;

 private:
  std::string path_;
  uint64_t seed_;
  float init_std_;
  DType dtype_;
  bool tied_;
  std::string model_type_;
  int64_t total_bytes_ = 0;
  std::map<std::string, RandomTensorSpec> specs_;  // by HF name
  mutable std::map<std::string, std::vector<uint8_t>> data_;
};

}  // namespace servetune
