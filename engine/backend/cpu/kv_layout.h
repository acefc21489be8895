// Where the CPU backend keeps K in a paged cache: transposed within each page, [num_blocks, n_kv_heads, head_dim,
// page_size], so one dimension of a run of consecutive positions is contiguous and decode scores take keys as
// vector lanes. V keeps KvLayerView's row layout [num_blocks, page_size, n_kv_heads, head_dim]. Only the CPU
// backend's own stores and attention read these caches. Internal linkage: safe to include from any ISA's file.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"

namespace servetune::cpu {

// Element index of dimension d of KV head kv_head of the K row in cache slot `slot` (block * page_size + within).
static inline int64_t k_cache_index(const KvLayerView& kv, int64_t slot, int64_t kv_head, int64_t d) {
  const int64_t block = slot / kv.page_size, within = slot - block * kv.page_size;
  return ((block * kv.n_kv_heads + kv_head) * kv.head_dim + d) * kv.page_size + within;
}

// scatter_k_row for elements of type T.
template <class T>
static inline void scatter_k_elements(const KvLayerView& kv, const uint8_t* row, int64_t slot) {
  auto* cache = static_cast<uint8_t*>(kv.k) + k_cache_index(kv, slot, 0, 0) * static_cast<int64_t>(sizeof(T));
  const int64_t step = kv.page_size * static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < kv.n_kv_heads * kv.head_dim; ++i) {
    T x;
    std::memcpy(&x, row + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    std::memcpy(cache + i * step, &x, sizeof(T));
  }
}
// Writes one K row already converted to the cache's element type (`elem` bytes each, n_kv_heads * head_dim of them
// in row order) into its transposed place.
static inline void scatter_k_row(const KvLayerView& kv, const uint8_t* row, int64_t elem, int64_t slot) {
  switch (elem) {
    case 1:
      return scatter_k_elements<uint8_t>(kv, row, slot);
    case 2:
      return scatter_k_elements<uint16_t>(kv, row, slot);
    case 4:
      return scatter_k_elements<uint32_t>(kv, row, slot);
    default:  // block-quantized types have no per-element place to transpose to
      throw Error(ErrorKind::kInternal, "CPU KV cache: no transposed K layout for " +
                                            std::string(dtype_name(kv.dtype)) + " elements");
  }
}

}  // namespace servetune::cpu
