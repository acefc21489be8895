// Tensor-parallel partition of a llama-family model's heads, feed-forward and vocabulary (see parallel.h).
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
  if (kv >= tp_size) {
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
  if (config.is_mla()) share.kv_heads = {0, 1};  // every rank caches the one shared latent row per token
  if (config.ffn % tp_size != 0) {
    throw_usage("tp_size " + std::to_string(tp_size) + " does not divide the model's feed-forward dimension " + std::to_string(config.ffn));
  }
  share.ffn = {config.ffn / tp_size * rank, config.ffn / tp_size};
  share.vocab = balanced_slice(config.vocab, tp_size, rank);
  return share;
}

}  // namespace servetune
