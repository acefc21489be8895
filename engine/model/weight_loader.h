// Sharding-aware weight loading: checks each tensor's shape against the config, slices this rank's part
// (rows for column-parallel layers, cols for row-parallel ones) and places it in backend memory — in place
// from the memory map when the backend uses host memory and no slicing or conversion is needed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/parallel.h"
#include "model/weight_source.h"

namespace servetune {

enum class Shard {
  kNone,  // every rank holds the whole tensor
  kRows,  // split output features (column-parallel: QKV, gate/up, vocab-parallel embedding and head)
  kCols,  // split input features (row-parallel: attention output, down)
};

class WeightLoader {
 public:
  WeightLoader(const WeightSource& source, Backend& backend, ParallelContext parallel);

  bool has(const std::string& name) const { return source_.find(name).has_value(); }
  // A [rows, cols] matrix (full shape, before sharding); throws Error(kFormat) naming the tensor on a shape mismatch.
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols, Shard shard);
  // A vector of `n` values as f32 (norm weights, biases), sharded like the rows of the matrix it belongs to.
  const float* vector(const std::string& name, int64_t n, Shard shard);

  // Buffers the loaded weights live in; the model keeps them.
  std::vector<std::unique_ptr<Buffer>> take_buffers() { return std::move(buffers_); }

 private:
  TensorRef require(const std::string& name) const;
  const void* place(const void* host, size_t bytes);

  const WeightSource& source_;
  Backend& backend_;
  ParallelContext parallel_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

}  // namespace servetune
