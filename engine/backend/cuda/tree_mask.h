// Draft-tree masks in the GPU attention kernels (attention.cu, decode_attention_split.cu, latent.cu): the device side of
// backend.h's attention_tree_token / attention_span / attention_sees, over AttentionBatch's tree_base and tree_mask
// (device memory; tree_mask 8-byte aligned).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/gpu_shim.h"

namespace servetune::gpu {

// A batch's tree arrays, passed to the kernels by value (both null: no tree in the batch).
struct TreeMasks {
  const int32_t* base = nullptr;
  const uint64_t* mask = nullptr;
};
inline TreeMasks tree_masks(const AttentionBatch& b) {
  return b.tree_mask == nullptr ? TreeMasks{} : TreeMasks{b.tree_base, b.tree_mask};
}

// One token's view of its sequence's cache: every index below `base`, then those whose bit (j - base) is set in
// `bits`; bits == 0: not a tree token (causal up to its position).
struct TreeView {
  int64_t base = 0;
  uint64_t bits = 0;
  // Whether the token sees cache index j (j below span(), so j - base < 64).
  __device__ bool sees(int64_t j) const { return bits == 0 || j < base || ((bits >> (j - base)) & 1u) != 0; }
  // The cache indices [0, span) the token scans.
  __device__ int64_t span(int32_t position) const {
    return bits == 0 ? static_cast<int64_t>(position) + 1 : base + 64 - __clzll(static_cast<long long>(bits));
  }
};
__device__ inline TreeView tree_view(TreeMasks tm, int64_t t) {
  TreeView v;
  if (tm.mask != nullptr) {
    v.bits = tm.mask[t];
    if (v.bits != 0) v.base = tm.base[t];
  }
  return v;
}

}  // namespace servetune::gpu
