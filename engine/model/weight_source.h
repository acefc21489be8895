// Named tensors of a checkpoint, whatever the file format. Names are GGUF's (token_embd.weight, blk.0.attn_q.weight,
// ...); shapes are [rows, cols] with cols contiguous (PyTorch order, the reverse of GGUF's dims).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace servetune {

// A layer's tensor under its GGUF-style name: blk.<layer>.<name>.
inline std::string blk(int64_t layer, std::string_view name) {
  return "blk." + std::to_string(layer) + "." + std::string(name);
}

class GgufFile;

// The tensor holding the block scales of FP8 weight `weight_name` ("blk.0.attn_q.weight" ->
// "blk.0.attn_q.weight_scale_inv"), as HF checkpoints name it: F32 [ceil(rows / 128), ceil(cols / 128)], each the
// factor its 128x128 block of codes is multiplied by (DeepSeek-V3/R1; the "inv" is of the quantization scale).
inline std::string block_scale_name(const std::string& weight_name) { return weight_name + "_scale_inv"; }

struct TensorRef {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> shape;  // outermost first; shape.back() is contiguous
  const uint8_t* data = nullptr;
  int64_t n_bytes = 0;

  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t rows() const;  // product of all but the last dimension
};

// How a random (dummy) tensor is drawn: N(mean, std) values from a counter-based generator keyed by `seed`, so a
// device backend can generate it in place instead of copying host values.
struct RandomRecipe {
  std::vector<int64_t> shape;
  uint64_t seed = 0;  // already mixed with the tensor's name
  float mean = 0.0f;
  float std = 0.0f;
  DType dtype = DType::kF32;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const std::string& path() const = 0;
  virtual std::optional<TensorRef> find(const std::string& name) const = 0;
  // What the file calls the tensor `name` (for messages): its HF name in a safetensors checkpoint.
  virtual std::string file_name(const std::string& name) const { return name; }
  // The recipe of a random tensor (dummy weights); nullopt for tensors read from files.
  virtual std::optional<RandomRecipe> random_recipe(const std::string& /*name*/) const { return std::nullopt; }
  // The loader has its own copy of these bytes (part of a tensor find() returned): a source mapping its file may
  // let the kernel drop their pages; find()'s pointers stay valid (the bytes are read back from the file if touched).
  virtual void copied(const uint8_t* /*data*/, int64_t /*bytes*/) const {}
  // Whether copied() gives memory back. Host backends copy tensors (onto huge pages) only from such sources; from
  // others (dummy weights held in memory) a copy would double the memory, so they use the tensors in place.
  virtual bool frees_copied() const { return false; }
};

// Tensors of a GGUF file, read from its memory map (whose pages copied() drops).
class GgufWeightSource final : public WeightSource {
 public:
  explicit GgufWeightSource(const GgufFile& file) : file_(file) {}
  const std::string& path() const override;
  std::optional<TensorRef> find(const std::string& name) const override;
  void copied(const uint8_t* data, int64_t bytes) const override;
  bool frees_copied() const override { return true; }

 private:
  const GgufFile& file_;
};

}  // namespace servetune
