// The public model information (servetune/model_info.h) on top of the checkpoint reader and the tensor-parallel
// partition, so API users learn a model's shape and splits exactly as the engine computes them.
#include "servetune/model_info.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/kv_storage.h"
#include "model/model_config.h"
#include "model/parallel.h"

namespace servetune {

ModelInfo model_info_of(const ModelConfig& c) {
  ModelInfo info;
  info.architecture = c.architecture;
  info.n_layers = c.n_layers;
  info.hidden = c.hidden;
  info.n_heads = c.n_heads;
  info.n_kv_heads = c.n_kv_heads;
  info.head_dim = c.head_dim;
  info.ffn = c.ffn;
  info.vocab = c.vocab;
  info.context_length = c.context_length;
  info.experts = c.moe.routing.n_experts;
  info.experts_per_token = c.moe.routing.top_k;
  info.expert_ffn = c.moe.expert_ffn;
  info.shared_expert_ffn = c.moe.shared_ffn;
  info.dense_layers = c.is_moe() ? std::count(c.moe.moe_layer.begin(), c.moe.moe_layer.end(), false) : c.n_layers;
  info.kv_values_per_token = c.kv_values_per_token(c.cache_heads());
  info.kv_shared_by_ranks = c.is_mla();
  return info;
}

ModelInfo read_model_info(const std::string& path, LoadFormat load_format) {
  const Checkpoint checkpoint(path, load_format);
  ModelInfo info = model_info_of(checkpoint.config());
  info.weight_bytes = checkpoint.weight_bytes();
  return info;
}

int64_t kv_element_bytes(KvCacheDtype setting, Device device) {
  return dtype_info(kv_storage_dtype(setting, device == Device::kCpu)).type_size;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof(text), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return text;
}

void check_tensor_parallel_split(const ModelInfo& model, int tp_size, int ep_size, bool dp_attention, int redundant_experts) {
  if (tp_size < 1) throw_usage("tp_size must be at least 1, got " + std::to_string(tp_size));
  if (ep_size < 1) throw_usage("ep_size must be at least 1, got " + std::to_string(ep_size));
  if (model.n_heads <= 0 || model.n_kv_heads <= 0 || model.ffn <= 0) {
    throw_usage("a model shape without attention heads, KV heads or feed-forward dimension cannot be split");
  }
  // The partition reads the heads, the feed-forward widths, the experts and the vocabulary; ModelInfo carries them
  // all (of latent attention only whether there is one, which is all the split depends on).
  ModelConfig c;
  c.architecture = model.architecture;
  c.n_layers = model.n_layers;
  c.hidden = model.hidden;
  c.n_heads = model.n_heads;
  c.n_kv_heads = model.n_kv_heads;
  c.head_dim = model.head_dim;
  c.ffn = model.ffn;
  c.vocab = model.vocab;
  c.context_length = model.context_length;
  c.mla.kv_lora_rank = model.kv_shared_by_ranks ? 1 : 0;
  c.moe.routing.n_experts = model.experts;
  c.moe.expert_ffn = model.expert_ffn;
  c.moe.shared_ffn = model.shared_expert_ffn;
  if (model.experts > 0) {  // which layers are dense does not matter to the split, only whether any is
    c.moe.moe_layer.assign(static_cast<size_t>(model.n_layers), true);
    std::fill_n(c.moe.moe_layer.begin(), std::min(model.dense_layers, model.n_layers), false);
  }
  if (dp_attention && model.experts == 0) {
    throw_usage("DP attention spreads the mixture-of-experts layers over the replicas; this " + model.architecture +
                " model has no routed experts");
  }
  tensor_parallel_share(c, dp_attention ? 1 : tp_size, 0);  // with DP attention each replica's attention is whole
  expert_parallel_share(c, tp_size, ep_size, 0, redundant_experts);
}

}  // namespace servetune
