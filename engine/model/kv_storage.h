// Physical paged KV cache memory of one model shard: per layer, K and V of [num_blocks + 1, page_size, kv_heads,
// head_dim] in backend memory (latent-attention models: one latent row per slot in K, no V; see ModelConfig). Which of the first num_blocks blocks belong to whom is the runtime's business
// (runtime/block_manager.h); the last one, scratch_block(), is nobody's: padding tokens of graph replays write there.
// All of it is made resident at construction, as GPU engines and llama.cpp hold their KV cache: the block manager
// hands out never-used blocks before it evicts cached ones, so otherwise a fresh server pays a page fault (and the
// kernel's zeroing) on the first write to every block, inside the requests it is timed on.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model_config.h"
#include "servetune/engine_setting_enums.h"

namespace servetune {

// The element type of a KV cache for the kv_cache_dtype setting: fp8_e4m3, bf16, f16, f32 as named; auto is f32 in
// host memory (exact against the reference) and bf16 on GPUs: half the memory and bandwidth, and f32's exponent range,
// so large activations cannot overflow as they can in f16 (vLLM's auto is the model's dtype, bf16 for bf16 models; the
// GPU backend keeps every non-f32 model's weights in bf16 and runs its GEMMs on bf16 activations already).
DType kv_storage_dtype(KvCacheDtype setting, bool host_memory);

class KvStorage {
 public:
  KvStorage(Backend& backend, const ModelConfig& config, int64_t local_kv_heads, int64_t num_blocks, int64_t page_size,
            DType dtype);

  // Bytes one block takes across all layers (K and V, or the latent rows) for this shard.
  static int64_t block_bytes(const ModelConfig& config, int64_t local_kv_heads, int64_t page_size, DType dtype);

  const KvLayerView& layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Every layer's rows of slots src[i] copied to slots dst[i], in order (Backend::copy_kv_slots).
  void copy_slots(Backend& backend, const std::vector<int32_t>& src, const std::vector<int32_t>& dst) const;
  int64_t num_blocks() const { return num_blocks_; }
  int64_t scratch_block() const { return num_blocks_; }
  int64_t page_size() const { return page_size_; }
  DType dtype() const { return dtype_; }

 private:
  int64_t num_blocks_;
  int64_t page_size_;
  DType dtype_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<KvLayerView> layers_;
};

}  // namespace servetune
