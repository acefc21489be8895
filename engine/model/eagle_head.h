// EAGLE draft heads for llama-family targets, in EAGLE-2's checkpoint layout as SGLang's LlamaForCausalLMEagle reads
// it: a directory with config.json (architectures [LlamaForCausalLMEagle], one layer, the target's width) and
// safetensors holding fc.weight [d, 2d] (fc.bias optional) and the layer as layers.0.* (input_layernorm optional),
// without embedding or head: those are the target's. The head runs as MoeDecoderModel's EAGLE mode.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "model/model.h"

namespace servetune {

class Checkpoint;
class SafetensorsSet;
class WeightSource;

class EagleHead {
 public:
  // Loads the head in `dir` for `target` on `backend`. Error(kUsage) naming `dir` when it is not an EAGLE head of the
  // target's hidden size and vocabulary; Error(kFormat) for missing or misshapen tensors (the loader names them).
  // `draft_vocab` (sorted target ids; empty: all) restricts the head's output to those tokens (moe_decoder.h);
  // `quantize_q8_0` stores its float matrices as Q8_0 (WeightLoader::quantize_float_matrices).
  EagleHead(const std::string& dir, const Checkpoint& target, Backend& backend, std::span<const int32_t> draft_vocab = {},
            bool quantize_q8_0 = false);
  ~EagleHead();
  Model& model() { return *model_; }

 private:
  std::unique_ptr<SafetensorsSet> files_;
  std::unique_ptr<WeightSource> source_;
  std::unique_ptr<Model> model_;
};

}  // namespace servetune
