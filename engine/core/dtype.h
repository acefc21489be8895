// Element types of tensors and weights (float and GGML block-quantized), with their block geometry.
// Quantized types store `block_size` elements in `type_size` bytes; a row's length must be a multiple of block_size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace servetune {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kI16,
  kI32,
  kI64,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_K,
  kFP8_E4M3,  // KV-cache / weight storage; not a GGUF type
  // FP8 E4M3 weight codes whose values are code * a f32 scale per 128x128 block, the scales held beside the matrix
  // (BlockScales): DeepSeek-V3/R1's block-scaled FP8 weights. A weight-matrix type only: rows are plain E4M3 bytes,
  // but no row means anything without its scales (no file stores this type; dequantize_row rejects it).
  kFP8_E4M3_B128,
};

// Rows and columns of one scale block of kFP8_E4M3_B128.
constexpr int64_t kFp8ScaleBlock = 128;

// The scales of a kFP8_E4M3_B128 matrix: value[r, c] = e4m3(code[r, c]) * at(r, c). Block row (r + row_offset) / 128
// starts `stride` floats after the one before; a row slice that starts inside a block keeps the block grid through
// row_offset (0..127), a column slice must start on a block boundary.
struct BlockScales {
  const float* data = nullptr;
  int64_t stride = 0;  // >= ceil(cols / 128)
  int64_t row_offset = 0;

  const float* row(int64_t r) const { return data + (r + row_offset) / kFp8ScaleBlock * stride; }
  float at(int64_t r, int64_t c) const { return row(r)[c / kFp8ScaleBlock]; }
  // Block rows that rows [0, rows) touch.
  int64_t block_rows(int64_t rows) const { return (row_offset + rows + kFp8ScaleBlock - 1) / kFp8ScaleBlock; }
};

struct DTypeInfo {
  std::string_view name;
  int64_t block_size;  // elements per block (1 for plain types)
  int64_t type_size;   // bytes per block
  bool quantized;
};

const DTypeInfo& dtype_info(DType t);
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }

// Bytes used by `n` elements; nullopt if n is not a multiple of the block size or the size overflows int64.
std::optional<int64_t> dtype_row_bytes(DType t, int64_t n);

// GGML type id (as stored in GGUF) <-> DType. Unknown ids give nullopt.
std::optional<DType> dtype_from_ggml(uint32_t ggml_type);
std::string ggml_type_name(uint32_t ggml_type);  // "Q4_1", or "unknown(123)"

// Parse "f32", "bf16", "q4_1", ... (case-insensitive).
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace servetune
