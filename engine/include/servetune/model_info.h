// What an API user may know of a model without loading its weights (public API): its shape as the engine reads it,
// and whether the engine can split it over a tensor-parallel group. The engine's own ModelConfig stays internal.
#pragma once

#include <cstdint>
#include <string>

#include "servetune/engine_setting_enums.h"

namespace servetune {

struct ModelInfo {
  std::string architecture;    // the engine's name of the family: "llama" or "qwen2"
  int64_t n_layers = 0;
  int64_t hidden = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;             // feed-forward (intermediate) dimension
  int64_t vocab = 0;
  int64_t context_length = 0;  // the model's own, before any context_length setting
  int64_t experts = 0;           // routed experts (0: dense)
  int64_t experts_per_token = 0;
  int64_t expert_ffn = 0;         // one routed expert's intermediate dimension
  int64_t shared_expert_ffn = 0;  // the shared experts' intermediate dimension (0: none)
  int64_t dense_layers = 0;       // layers with the dense MLP of width ffn (all of a dense model's)
  // Memory from the files (or the config alone, for dummy weights): the weights as stored, and the KV cache values
  // one token takes over all layers (per-head K and V, or a latent-attention model's one latent row per layer); times
  // the cache's element size that is its bytes per token.
  int64_t weight_bytes = 0;
  int64_t kv_values_per_token = 0;
  bool kv_shared_by_ranks = false;  // latent attention: every tensor-parallel rank caches the whole row
};

// Bytes of one KV cache element for the kv_cache_dtype setting on `device`, as the engine sizes its cache (auto: f32
// on the cpu, bf16 on GPUs); times kv_values_per_token, a token's KV bytes.
int64_t kv_element_bytes(KvCacheDtype setting, Device device);

// "1.5 GiB" / "70.3 KiB": a byte count for messages.
std::string format_bytes(double bytes);

// The shape of the model at `path` as the engine opens it with `load_format`; the weights are mapped, not read.
// Throws the engine's Error for a bad path or file.
ModelInfo read_model_info(const std::string& path, LoadFormat load_format = LoadFormat::kAuto);

// Throws Error(kUsage) naming the numbers when the engine cannot split `model` over `tp_size` tensor-parallel ranks
// with `ep_size` expert-parallel groups (tp_size below 1, KV heads that neither cover nor divide the ranks, query heads
// or the feed-forward dimension that do not divide; ep_size > 1 on a dense model, ep_size not dividing tp_size or the
// experts, expert widths that do not divide by tp_size / ep_size); returns when it can. Memory per rank does not
// depend on ep_size: each rank holds 1 / tp_size of the routed experts' weights either way (whole experts of its
// group's range split moe_tp ways, or a 1 / tp_size slice of every expert).
// With `dp_attention` the attention runs whole on each of the tp_size replicas and only the routed experts split;
// `redundant_experts` extra expert slots (ep_num_redundant_experts) split over the groups with the routed experts.
void check_tensor_parallel_split(const ModelInfo& model, int tp_size, int ep_size = 1, bool dp_attention = false,
                                 int redundant_experts = 0);

}  // namespace servetune
