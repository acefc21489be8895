// A Batch's index arrays where a backend's ops read them: the Batch's own vectors on host-memory backends, one packed
// copy in backend memory otherwise (draft-tree masks 8-byte aligned in it), so a device backend gets them in one upload.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "model/batch.h"

namespace servetune {

struct BatchIndices {
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* seq_of_token = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* logits_rows = nullptr;
  const int32_t* tree_base = nullptr;  // null without a draft tree
  const uint64_t* tree_mask = nullptr;
};

// Copies the packed values into backend memory the model keeps and returns where they start there (8-byte aligned).
using UploadIndices = std::function<const int32_t*(const std::vector<int32_t>& packed)>;

// `batch`'s index arrays for `backend`: in place on a host-memory backend; otherwise packed into `staging` and handed
// to `upload`.
BatchIndices place_batch_indices(const Backend& backend, const Batch& batch, std::vector<int32_t>& staging,
                                 const UploadIndices& upload);

}  // namespace servetune
