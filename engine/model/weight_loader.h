// Sharding-aware weight loading: checks each tensor's shape against the config, slices this rank's part
// (whole rows for column-parallel layers, whole quant blocks of every row for row-parallel ones) and places it in
// backend memory. Host backends get every matrix of a memory-mapped checkpoint copied into a few large buffers (see
// place()) and the map's pages dropped, so the matmuls stream them through 2 MB pages; tensors of sources that
// cannot give their memory back (dummy weights) are used in place. FP8 E4M3 matrices come with their 128x128 block
// scales (the tensor block_scale_name(name) beside them, as DeepSeek-V3/R1 ship them): one byte a weight plus the
// scales (kFP8_E4M3_B128) on backends that keep that type (the CPU; CUDA on sm_90 for the shapes its FP8 GEMM takes:
// Backend::keeps_block_scaled), dequantized to bf16 once at load on the others.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/parallel.h"
#include "model/weight_source.h"

namespace servetune {

class WeightLoader {
 public:
  WeightLoader(const WeightSource& source, Backend& backend, ParallelContext parallel);

  bool has(const std::string& name) const { return source_.find(name).has_value(); }
  // A whole [rows, cols] matrix; throws Error(kFormat) naming the tensor on a shape mismatch with the config, and for
  // an FP8 tensor whose block scales are missing or not [ceil(rows / 128), ceil(cols / 128)] (naming the scale tensor).
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols);
  // Rows [range) of a [rows, cols] matrix (column-parallel layers: output features). An FP8 slice may start inside a
  // 128-row scale block: its scales keep the block grid through BlockScales::row_offset.
  WeightMatrix matrix_rows(const std::string& name, int64_t rows, int64_t cols, SliceRange range);
  // The rows `ids` (any order, each in [0, rows)) of a [rows, cols] matrix, gathered into one matrix in that order
  // (a draft head's output rows for its draft vocabulary). The source tensor is left to its other users. Not for
  // block-scaled FP8 (Error(kUnsupported) naming the tensor: its scales come in 128-row blocks).
  WeightMatrix matrix_row_subset(const std::string& name, int64_t rows, int64_t cols, std::span<const int32_t> ids);
  // Matrices [which) of a stack of `n` [rows, cols] matrices stored as one [n, rows, cols] tensor (llama.cpp's
  // stacked experts, DeepSeek's per-head attn_k_b / attn_v_b), as one [which.count * rows, cols] matrix.
  WeightMatrix stacked_matrices(const std::string& name, int64_t n, int64_t rows, int64_t cols, SliceRange which);
  // Rows [row_range) x columns [col_range) of matrix `index` of such a stack (one expert's shard of llama.cpp's
  // *_exps); the columns must fall on quant-block boundaries, as for matrix_cols.
  WeightMatrix stacked_matrix_part(const std::string& name, int64_t n, int64_t rows, int64_t cols, int64_t index,
                                   SliceRange row_range, SliceRange col_range);
  // Columns [range) of every row (row-parallel layers: input features). For block-quantized types the range must
  // fall on quant-block boundaries, for FP8 on 128-column scale blocks (or end at the last column), else Error(kUsage)
  // naming the tensor, the range and tp_size.
  WeightMatrix matrix_cols(const std::string& name, int64_t rows, int64_t cols, SliceRange range);
  // A vector of `n` values as f32 (norm weights, biases), or its part [range) (biases of column-parallel layers).
  const float* vector(const std::string& name, int64_t n);
  const float* vector(const std::string& name, int64_t n, SliceRange range);

  // Several matrices' rows [range) stacked into one matrix (fused QKV and gate/up projections); all parts share cols
  // and file type.
  struct RowPart {
    std::string name;
    int64_t rows = 0;
    int64_t cols = 0;
    SliceRange range;
  };
  WeightMatrix stacked_rows(const std::vector<RowPart>& parts);
  // Whether these tensors share one storage type in this backend, so stacked_rows can join them (a Q4_K_M GGUF's
  // attn_v in Q6_K next to Q4_K q and k cannot be on the CPU; on a GPU all become bf16). Never for FP8 tensors kept
  // block-scaled (the CPU): the parts' rows would not line up with 128-row scale blocks in general.
  bool stackable(const std::vector<std::string>& names) const;
  // Several vectors' parts [range) one after another (the fused QKV bias).
  struct VectorPart {
    std::string name;
    int64_t n = 0;
    SliceRange range;
  };
  const float* stacked_vectors(const std::vector<VectorPart>& parts);

  // From now on, float (f32 / f16 / bf16) matrices are stored quantized to `type` (Q8_0 only; host-memory backends,
  // rows of whole 32-value blocks, else Error(kUnsupported) naming the tensor): a draft head's weights made cheaper to
  // read (speculative_draft_model_quantization). Other types load as before.
  void quantize_float_matrices(DType type);

  // The tensors it reads: a model on a device backend reads some of them again through a loader on a host backend, to
  // derive weights on the host (MLA's absorbed projections) or to route on the host (a router's selection bias).
  const WeightSource& source() const { return source_; }

  // Buffers the loaded weights live in; the model keeps them.
  std::vector<std::unique_ptr<Buffer>> take_buffers() {
    arena_ = nullptr;
    arena_used_ = 0;
    placed_rows_.clear();
    return std::move(buffers_);
  }

 private:
  // How a matrix of `type` is stored: the backend's choice, or quantize_float_matrices' for float types.
  DType storage_type(DType type) const;
  // Error(kUnsupported) naming the tensor when a matrix of `cols` columns would be re-quantized to Q8_0 but its rows
  // are not whole 32-value blocks (checked before any row size of the stored type is computed).
  void check_storable(const std::string& name, DType type, int64_t cols) const;
  TensorRef require(const std::string& name) const;
  TensorRef require_matrix(const std::string& name, int64_t rows, int64_t cols) const;
  // A [n, rows, cols] tensor in whole quant blocks per row, not block-scaled FP8.
  TensorRef require_stacked(const std::string& name, int64_t n, int64_t rows, int64_t cols) const;
  // Bytes before column range.begin in a row of `type`; Error(kUsage) naming the tensor and the ranks when the range
  // does not fall on quant-block boundaries.
  int64_t column_offset_bytes(const std::string& name, DType type, int64_t cols, SliceRange range) const;
  // The block scales of FP8 matrix `t` (loaded as `name`) as f32, [ceil(rows / 128), ceil(cols / 128)] row-major.
  std::vector<float> block_scales(const std::string& name, const TensorRef& t) const;
  // The scale rows that `rows` rows read from `host` (ceil(cols / 128) of each), packed at 16-byte strides
  // (fp8_scale_stride: cuBLASLt's 128x128 layout) and placed.
  BlockScales place_scales(const BlockScales& host, int64_t rows, int64_t cols);
  // `bytes` from `host` in backend memory. Host backends: bump-allocated (64-byte aligned) from buffers of at least
  // kArenaBytes, which host backends map on transparent huge pages (2 MB and up), so a matmul streaming its matrix
  // walks a TLB entry per 2 MB instead of per 4 KB; one buffer per matrix would stay below that size.
  const void* place(const void* host, size_t bytes);
  // Rows `stride` bytes apart starting at `first`, in the backend's storage type for `type` (packed, converted and
  // placed; contiguous rows already in that type are copied once however often they are asked for, as a tied
  // embedding serves as the token table and the output head, or used in place on a host backend when the source
  // cannot give memory back). kFP8_E4M3_B128 rows need `scales` (host memory, row 0 of the rows being the first).
  WeightMatrix place_matrix(const std::string& name, DType type, int64_t rows, int64_t cols, const uint8_t* first,
                            int64_t stride, const BlockScales* scales = nullptr);
  // storage_type(type), except that a block-scaled FP8 matrix the backend cannot take in this shape
  // (Backend::keeps_block_scaled) is stored as bf16.
  DType matrix_storage(DType type, int64_t rows, int64_t cols, const BlockScales* scales) const;
  // Appends `rows` rows (`stride` bytes apart from `first`) to `out` as `store` (the storage type chosen for `type`).
  void append_rows(const std::string& name, DType type, DType store, int64_t rows, int64_t cols, const uint8_t* first,
                   int64_t stride, std::vector<uint8_t>& out, const BlockScales* scales = nullptr) const;
  // Appends values [range) of vector `name` as f32; sets host_view_ when they can be used in place from the map.
  void append_vector(const std::string& name, int64_t n, SliceRange range, std::vector<float>& out);

  std::optional<DType> float_matrices_;  // quantize_float_matrices
  const WeightSource& source_;
  Backend& backend_;
  ParallelContext parallel_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  Buffer* arena_ = nullptr;  // the one of buffers_ place() fills on a host backend, up to arena_used_ bytes
  size_t arena_used_ = 0;
  std::map<std::pair<const uint8_t*, int64_t>, const void*> placed_rows_;  // place_matrix's copies by source bytes
  const float* host_view_ = nullptr;
};

}  // namespace servetune
