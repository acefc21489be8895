// Named tensors of a checkpoint, whatever the file format. Names are GGUF's (token_embd.weight, blk.0.attn_q.weight,
// ...); shapes are [rows, cols] with cols contiguous (PyTorch order, the reverse of GGUF's dims).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace servetune {

class GgufFile;

struct TensorRef {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> shape;  // outermost first; shape.back() is contiguous
  const uint8_t* data = nullptr;
  int64_t n_bytes = 0;

  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t rows() const;  // product of all but the last dimension
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const std::string& path() const = 0;
  virtual std::optional<TensorRef> find(const std::string& name) const = 0;
};

// Tensors of a GGUF file, used in place.
class GgufWeightSource final : public WeightSource {
 public:
  explicit GgufWeightSource(const GgufFile& file) : file_(file) {}
  const std::string& path() const override;
  std::optional<TensorRef> find(const std::string& name) const override;

 private:
  const GgufFile& file_;
};

}  // namespace servetune
