// Tensor- and expert-parallel partition of a model's heads, feed-forward, routed experts and vocabulary (see parallel.h).
#include "model/parallel.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "model/model_config.h"

namespace servetune {

SliceRange balanced_slice(int64_t n, int parts, int index) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = base * index + std::min<int64_t>(index, extra);
  return {begin, base + (index < extra ? 1 : 0)};
}

TensorParallelShare tensor_parallel_share(const ModelConfig& config, int tp_size, int rank) {
  if (tp_size < 1 || rank < 0 || rank >= tp_size) {
    throw Error(ErrorKind::kInternal, "tensor-parallel rank " + std::to_string(rank) + " outside a group of " + std::to_string(tp_size));
  }
  const int64_t heads = config.n_heads, kv = config.n_kv_heads, group = heads / kv;
  const std::string model = "the model's " + std::to_string(heads) + " attention heads and " + std::to_string(kv) + " KV heads";
  TensorParallelShare share;
  if (config.is_mla()) {
    // Every head reads the one latent row per token, so any split of the heads works; every rank caches that row.
    if (tp_size > heads) {
      throw_usage("tp_size " + std::to_string(tp_size) + " exceeds the model's " + std::to_string(heads) +
                  " attention heads (latent attention splits whole heads)");
    }
    share.q_heads = balanced_slice(heads, tp_size, rank);
    share.kv_heads = {0, 1};
  } else if (kv >= tp_size) {
    // Whole KV groups per rank; uneven counts are fine (every rank's query heads still read its own KV heads).
    share.kv_heads = balanced_slice(kv, tp_size, rank);
    share.q_heads = {share.kv_heads.begin * group, share.kv_heads.count * group};
  } else {
    if (tp_size % kv != 0) {
      throw_usage("tp_size " + std::to_string(tp_size) + " cannot split " + model +
                  ": with fewer KV heads than ranks, tp_size must be a multiple of the KV head count");
    }
    const int64_t copies = tp_size / kv;  // ranks sharing (replicating) one KV head
    if (group % copies != 0) {
      throw_usage("tp_size " + std::to_string(tp_size) + " cannot split " + model + ": each KV head's " + std::to_string(group) +
                  " query heads do not divide over the " + std::to_string(copies) + " ranks that replicate it");
    }
    share.kv_heads = {rank / copies, 1};
    share.q_heads = {rank * (heads / tp_size), heads / tp_size};
  }
  // The dense MLP's width matters only where a layer has one (every layer of a llama; a MoE model's dense layers).
  const bool dense_layers = !config.is_moe() || std::count(config.moe.moe_layer.begin(), config.moe.moe_layer.end(), false) > 0;
  if (dense_layers && config.ffn % tp_size != 0) {
    throw_usage("tp_size " + std::to_string(tp_size) + " does not divide the model's feed-forward dimension " + std::to_string(config.ffn));
  }
  share.ffn = {config.ffn / tp_size * rank, config.ffn / tp_size};
  share.vocab = balanced_slice(config.vocab, tp_size, rank);
  return share;
}

ExpertShare expert_parallel_share(const ModelConfig& config, int tp_size, int ep_size, int rank, int redundant) {
  const auto num = [](int64_t v) { return std::to_string(v); };
  if (ep_size < 1 || tp_size % ep_size != 0) {
    throw_usage("ep_size " + num(ep_size) + " does not divide tp_size " + num(tp_size) +
                " (the experts' ranks are ep_size groups of tp_size / ep_size, as in SGLang)");
  }
  if (!config.is_moe()) {
    if (ep_size > 1) {
      throw_usage("ep_size " + num(ep_size) + " splits routed experts, and this " + config.architecture + " model has none");
    }
    return {};
  }
  const MoeConfig& m = config.moe;
  if (redundant < 0) throw_usage("ep_num_redundant_experts must be at least 0, got " + num(redundant));
  if (redundant > 0 && ep_size == 1) {
    throw_usage("ep_num_redundant_experts " + num(redundant) + " copies hot experts onto other expert-parallel groups; it "
                "needs ep_size > 1");
  }
  const int64_t experts = m.routing.n_experts + redundant;
  const int moe_tp = tp_size / ep_size;
  if (experts % ep_size != 0) {
    throw_usage("ep_size " + num(ep_size) + " does not divide the model's " + num(m.routing.n_experts) + " routed experts" +
                (redundant > 0 ? " + " + num(redundant) + " redundant ones" : std::string()));
  }
  if (m.expert_ffn % moe_tp != 0) {
    throw_usage("tp_size " + num(tp_size) + " / ep_size " + num(ep_size) + " = " + num(moe_tp) +
                " ranks per expert do not divide the experts' intermediate dimension " + num(m.expert_ffn));
  }
  if (m.shared_ffn % tp_size != 0) {
    throw_usage("tp_size " + num(tp_size) + " does not divide the shared experts' intermediate dimension " + num(m.shared_ffn));
  }
  const int ep_rank = rank / moe_tp, moe_tp_rank = rank % moe_tp;  // SGLang's moe_ep_rank and moe_tp_rank
  ExpertShare share;
  share.experts = {experts / ep_size * ep_rank, experts / ep_size};
  share.expert_ffn = {m.expert_ffn / moe_tp * moe_tp_rank, m.expert_ffn / moe_tp};
  share.shared_ffn = {m.shared_ffn / tp_size * rank, m.shared_ffn / tp_size};
  return share;
}

}  // namespace servetune
