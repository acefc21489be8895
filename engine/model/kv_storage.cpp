// Paged KV cache memory allocation.
#include "model/kv_storage.h"

#include "core/error.h"

namespace servetune {

int64_t KvStorage::block_bytes(const ModelConfig& config, int64_t local_kv_heads, int64_t page_size, DType dtype) {
  const int64_t elem = dtype_info(dtype).type_size;
  return config.kv_values_per_token(local_kv_heads) * page_size * elem;
}

DType kv_storage_dtype(KvCacheDtype setting, bool host_memory) {
  if (setting == KvCacheDtype::kFp8E4m3) return DType::kFP8_E4M3;
  if (setting == KvCacheDtype::kF16) return DType::kF16;
  if (setting == KvCacheDtype::kBf16 || (setting == KvCacheDtype::kAuto && !host_memory)) return DType::kBF16;
  return DType::kF32;
}

KvStorage::KvStorage(Backend& backend, const ModelConfig& config, int64_t local_kv_heads, int64_t num_blocks,
                     int64_t page_size, DType dtype)
    : num_blocks_(num_blocks), page_size_(page_size), dtype_(dtype) {
  if (!backend.supports_kv_dtype(dtype)) {
    throw_unsupported("kv_cache_dtype " + std::string(dtype_name(dtype)) + " is not supported on the " + backend.name() +
                      " backend");
  }
  // MLA: one latent row per token (kv_lora_rank + rope dims) in the K buffer, no V.
  const bool latent = config.is_mla();
  const int64_t row = latent ? config.kv_values_per_head() : config.head_dim;
  const size_t layer_bytes = static_cast<size_t>((num_blocks + 1) * page_size * local_kv_heads * row * dtype_info(dtype).type_size);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    auto k = backend.allocate(layer_bytes);
    auto v = latent ? nullptr : backend.allocate(layer_bytes);
    try {
      backend.make_resident(*k);
      if (v) backend.make_resident(*v);
    } catch (const Error& e) {
      throw_usage("the KV cache (" + std::to_string(num_blocks) + " blocks of " + std::to_string(page_size) +
                  " tokens) does not fit in memory: " + e.what() + "; lower mem_fraction_static or max_total_tokens");
    }
    KvLayerView view{k->data(), v ? v->data() : nullptr, dtype, num_blocks + 1, page_size, local_kv_heads, row};
    layers_.push_back(view);
    buffers_.push_back(std::move(k));
    if (v) buffers_.push_back(std::move(v));
  }
}

void KvStorage::copy_slots(Backend& backend, const std::vector<int32_t>& src, const std::vector<int32_t>& dst) const {
  if (src.size() != dst.size()) throw Error(ErrorKind::kInternal, "KvStorage::copy_slots: src and dst differ in length");
  if (src.empty()) return;
  for (const KvLayerView& view : layers_) backend.copy_kv_slots(view, src.data(), dst.data(), static_cast<int64_t>(src.size()));
}

}  // namespace servetune
