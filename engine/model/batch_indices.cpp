// place_batch_indices (see batch_indices.h).
#include "model/batch_indices.h"

#include <cstring>

namespace servetune {

BatchIndices place_batch_indices(const Backend& backend, const Batch& batch, std::vector<int32_t>& staging,
                                 const UploadIndices& upload) {
  const std::vector<int32_t>* parts[] = {&batch.tokens, &batch.slot_mapping, &batch.positions, &batch.seq_of_token,
                                         &batch.block_tables, &batch.logits_indices};
  BatchIndices ix;
  const int32_t** fields[] = {&ix.tokens, &ix.slots, &ix.positions, &ix.seq_of_token, &ix.block_tables, &ix.logits_rows};
  constexpr size_t kParts = sizeof(parts) / sizeof(parts[0]);
  if (backend.host_memory()) {
    for (size_t i = 0; i < kParts; ++i) *fields[i] = parts[i]->data();
    if (batch.has_tree()) {
      ix.tree_base = batch.tree_base.data();
      ix.tree_mask = batch.tree_mask.data();
    }
    return ix;
  }
  size_t offsets[kParts];
  staging.clear();
  for (size_t i = 0; i < kParts; ++i) {
    offsets[i] = staging.size();
    staging.insert(staging.end(), parts[i]->begin(), parts[i]->end());
  }
  // The tree's bases, then its mask words from an even index: 8-byte aligned in a buffer that is.
  size_t tree_base = 0, tree_mask = 0;
  if (batch.has_tree()) {
    tree_base = staging.size();
    staging.insert(staging.end(), batch.tree_base.begin(), batch.tree_base.end());
    if (staging.size() % 2 != 0) staging.push_back(0);
    tree_mask = staging.size();
    staging.resize(tree_mask + 2 * batch.tree_mask.size());
    std::memcpy(staging.data() + tree_mask, batch.tree_mask.data(), batch.tree_mask.size() * sizeof(uint64_t));
  }
  const int32_t* base = upload(staging);
  for (size_t i = 0; i < kParts; ++i) *fields[i] = base + offsets[i];
  if (batch.has_tree()) {
    ix.tree_base = base + tree_base;
    ix.tree_mask = reinterpret_cast<const uint64_t*>(base + tree_mask);
  }
  return ix;
}

}  // namespace servetune
