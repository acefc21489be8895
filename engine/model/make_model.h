// Random-weight HF checkpoints (config.json, safetensors shards, byte-level tokenizer.json) that servetune,
// transformers and vLLM can load: the engine-side forms of servetune/make_model.h, on HfModelConfig and DType.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/hf_config.h"
#include "servetune/make_model.h"

namespace servetune {

// The config of a preset (model_preset_names()); Error(kUsage) lists them.
HfModelConfig model_preset(const std::string& name);

// Writes the checkpoint into `dir` (created if needed). Weights are deterministic in (config, seed); shards are
// at most `shard_bytes` each (with model.safetensors.index.json when there is more than one).
void write_random_model(const HfModelConfig& config, const std::string& dir, uint64_t seed, DType dtype,
                        float init_std, int64_t shard_bytes = int64_t{2} << 30);

// A byte-level BPE tokenizer.json (no merges: one token per byte, plus <unk> <s> </s>) for random-weight models.
std::string byte_level_tokenizer_json();

}  // namespace servetune
