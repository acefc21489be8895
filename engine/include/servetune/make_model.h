// Random-weight checkpoints (public API, `servetune make-model`): llama-family shapes, and the mixture-of-experts /
// latent-attention families as presets. HF safetensors + config.json + a byte-level tokenizer.json that servetune,
// transformers and vLLM load. Weights are deterministic in (shape, seed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace servetune {

// An explicit shape (HF config.json fields; rms_norm_eps 1e-5, head_dim hidden / heads, no rope scaling).
struct RandomModelShape {
  std::string arch = "llama";  // the HF model_type: "llama" or "qwen2" (q/k/v biases)
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;        // 0: heads
  int64_t intermediate = 0;
  int64_t vocab = 0;
  int64_t context = 4096;      // max_position_embeddings
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
};

enum class WeightDType { kF32, kF16, kBF16 };

// What was written, for a summary line: the HF architecture ("LlamaForCausalLM", ...) and the main sizes.
struct RandomModelSummary {
  std::string architecture;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;
};

// Preset names (tiny, smollm2-135m, llama-3.2-1b, llama-3-8b, ..., then the mixture-of-experts / latent-attention
// test shapes deepseek-v3-tiny, deepseek-v2-lite-tiny, qwen3-moe-tiny, mixtral-tiny), in a fixed order.
const std::vector<std::string>& model_preset_names();

// Write the named preset (Error(kUsage) lists the presets) or an explicit shape (Error(kUsage) names the first bad
// field) into `dir`, created if needed; the byte-level tokenizer needs vocab >= 259. Error(kIo) when writing fails.
RandomModelSummary make_random_model(const std::string& preset, const std::string& dir, uint64_t seed,
                                     WeightDType dtype, float init_std);
RandomModelSummary make_random_model(const RandomModelShape& shape, const std::string& dir, uint64_t seed,
                                     WeightDType dtype, float init_std);

}  // namespace servetune
