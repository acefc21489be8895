// HuggingFace checkpoints of the supported families: config.json -> ModelConfig, and safetensors tensors exposed
// under the GGUF names the layers ask for (model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight, ...).
#pragma once

#include <memory>
#include <string>

#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace servetune {

ModelConfig model_config_from_hf(const HfModelConfig& hf, const std::string& source);

// The HF tensor name in a checkpoint of `model_type` for a GGUF-style name (blk.N.ffn_gate.E.weight: routed expert E),
// or "" when there is none.
std::string hf_tensor_name(const std::string& gguf_name, const std::string& model_type);
// A safetensors tensor as a WeightSource's TensorRef, under the name the file gives it.
TensorRef tensor_ref(const std::string& file_name, const SafetensorsTensor& t);

class SafetensorsWeightSource final : public WeightSource {
 public:
  SafetensorsWeightSource(const SafetensorsSet& set, std::string path, bool tied_embeddings, std::string model_type)
      : set_(set), path_(std::move(path)), tied_(tied_embeddings), model_type_(std::move(model_type)) {}
  const std::string& path() const override { return path_; }
  std::optional<TensorRef> find(const std::string& name) const override;
  std::string file_name(const std::string& name) const override;
  void copied(const uint8_t* data, int64_t bytes) const override;
  bool frees_copied() const override { return true; }

 private:
  const SafetensorsSet& set_;
  std::string path_;
  bool tied_;
  std::string model_type_;
};

}  // namespace servetune
