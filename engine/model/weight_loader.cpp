// Sharding-aware weight loading (see weight_loader.h).
#include "model/weight_loader.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "backend/fp8_layout.h"
#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"

namespace servetune {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

int64_t scale_blocks(int64_t n) { return (n + kFp8ScaleBlock - 1) / kFp8ScaleBlock; }

// The type a matrix stored in a file as `file_type` is loaded as: FP8 weights carry their block scales.
DType matrix_type(DType file_type) { return file_type == DType::kFP8_E4M3 ? DType::kFP8_E4M3_B128 : file_type; }

}  // namespace

WeightLoader::WeightLoader(const WeightSource& source, Backend& backend, ParallelContext parallel)
    : source_(source), backend_(backend), parallel_(parallel) {}

TensorRef WeightLoader::require(const std::string& name) const {
  auto t = source_.find(name);
  if (!t) {
    const std::string in_file = source_.file_name(name);
    throw_format(source_.path(), "missing tensor '" + in_file + "'" + (in_file == name ? "" : " (" + name + ")"));
  }
  return *t;
}

void WeightLoader::quantize_float_matrices(DType type) {
  if (type != DType::kQ8_0 || !backend_.host_memory()) {
    throw Error(ErrorKind::kInternal, "float matrices are re-quantized to Q8_0 on host-memory backends only");
  }
  float_matrices_ = type;
}

DType WeightLoader::storage_type(DType type) const {
  const bool is_float = type == DType::kF32 || type == DType::kF16 || type == DType::kBF16;
  return is_float && float_matrices_ ? *float_matrices_ : backend_.matrix_storage_type(type);
}

void WeightLoader::check_storable(const std::string& name, DType type, int64_t cols) const {
  if (storage_type(type) == DType::kQ8_0 && type != DType::kQ8_0 && cols % 32 != 0) {
    throw_unsupported(source_.path() + ": tensor '" + name + "' has " + std::to_string(cols) +
                      " columns, not whole Q8_0 blocks of 32: it cannot be quantized to Q8_0");
  }
}

const void* WeightLoader::place(const void* host, size_t bytes) {
  if (backend_.host_memory()) {
    constexpr size_t kArenaBytes = size_t{64} << 20, kAlign = 64;
    const size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (arena_ == nullptr || arena_->size() - arena_used_ < padded) {
      buffers_.push_back(backend_.allocate(std::max(padded, kArenaBytes)));
      arena_ = buffers_.back().get();
      arena_used_ = 0;
    }
    const size_t offset = arena_used_;
    backend_.upload(*arena_, offset, host, bytes);
    arena_used_ += padded;
    return static_cast<const uint8_t*>(arena_->data()) + offset;
  }
  auto buffer = backend_.allocate(bytes);
  backend_.upload(*buffer, 0, host, bytes);
  const void* p = buffer->data();
  buffers_.push_back(std::move(buffer));
  return p;
}

DType WeightLoader::matrix_storage(DType type, int64_t rows, int64_t cols, const BlockScales* scales) const {
  const DType store = storage_type(type);
  if (store != DType::kFP8_E4M3_B128 || scales == nullptr) return store;
  return backend_.keeps_block_scaled(rows, cols, scales->row_offset) ? store : DType::kBF16;
}

void WeightLoader::append_rows(const std::string& name, DType type, DType store, int64_t rows, int64_t cols,
                               const uint8_t* first, int64_t stride, std::vector<uint8_t>& out,
                               const BlockScales* scales) const {
  check_storable(name, type, cols);
  const int64_t row_bytes = *dtype_row_bytes(store, cols);
  const size_t begin = out.size();
  out.resize(begin + static_cast<size_t>(rows * row_bytes));
  uint8_t* dst = out.data() + begin;
  if (store == type) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * row_bytes, first + r * stride, static_cast<size_t>(row_bytes));
    return;
  }
  const bool block_scaled = type == DType::kFP8_E4M3_B128;
  if (store == DType::kQ8_0 && float_matrices_) {  // quantize_float_matrices: a float matrix re-quantized row by row
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(type, first + r * stride, row.data(), cols);
      quantize_row(DType::kQ8_0, row.data(), dst + r * row_bytes, cols);
    }
    return;
  }
  if (store != DType::kBF16 || !(can_dequantize(type) || block_scaled)) {
    throw_unsupported(source_.path() + ": tensor '" + name + "' (" + std::string(dtype_name(type)) + ") cannot be converted to " +
                      std::string(dtype_name(store)) + " for the " + backend_.name() + " backend");
  }
  // Dequantized once at load, row by row, into the backend's storage type.
  std::vector<float> row(static_cast<size_t>(cols));
  auto* bf16 = reinterpret_cast<uint16_t*>(dst);
  for (int64_t r = 0; r < rows; ++r) {
    if (block_scaled) {
      dequantize_fp8_block_row(first + r * stride, scales->row(r), row.data(), cols);
    } else {
      dequantize_row(type, first + r * stride, row.data(), cols);
    }
    for (int64_t c = 0; c < cols; ++c) bf16[r * cols + c] = f32_to_bf16(row[static_cast<size_t>(c)]);
  }
}

WeightMatrix WeightLoader::place_matrix(const std::string& name, DType type, int64_t rows, int64_t cols, const uint8_t* first,
                                        int64_t stride, const BlockScales* scales) {
  if ((type == DType::kFP8_E4M3_B128) != (scales != nullptr)) {
    throw Error(ErrorKind::kInternal, "tensor '" + name + "': block scales go with FP8_E4M3_B128 rows and nothing else");
  }
  check_storable(name, type, cols);
  WeightMatrix w;
  w.type = matrix_storage(type, rows, cols, scales);
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = *dtype_row_bytes(w.type, cols);
  if (w.type == type && scales != nullptr) w.scales = place_scales(*scales, rows, cols);
  if (w.type == type && stride == w.row_bytes) {
    if (backend_.host_memory() && !source_.frees_copied()) {
      w.data = first;
      return w;
    }
    const int64_t bytes = rows * w.row_bytes;
    const void*& copy = placed_rows_[{first, bytes}];
    if (copy == nullptr) {
      copy = place(first, static_cast<size_t>(bytes));
      source_.copied(first, bytes);
    }
    w.data = copy;
    return w;
  }
  std::vector<uint8_t> bytes;
  append_rows(name, type, w.type, rows, cols, first, stride, bytes, scales);
  w.data = place(bytes.data(), bytes.size());
  // Whole rows (converted): done with them. Column slices (tensor parallelism) leave the other ranks' columns alone.
  if (stride == *dtype_row_bytes(type, cols)) source_.copied(first, rows * stride);
  return w;
}

bool WeightLoader::stackable(const std::vector<std::string>& names) const {
  std::optional<DType> common;
  for (const std::string& name : names) {
    std::optional<DType> type;
    if (auto recipe = source_.random_recipe(name)) type = recipe->dtype;
    else if (auto t = source_.find(name)) type = matrix_type(t->type);
    if (!type) return false;
    const DType stored = storage_type(*type);
    if (stored == DType::kFP8_E4M3_B128) return false;
    if (common && *common != stored) return false;
    common = stored;
  }
  return true;
}

WeightMatrix WeightLoader::stacked_rows(const std::vector<RowPart>& parts) {
  if (parts.empty()) throw Error(ErrorKind::kInternal, "stacked_rows needs parts");
  const int64_t cols = parts.front().cols;
  int64_t rows = 0;
  for (const RowPart& part : parts) {
    if (part.cols != cols) throw Error(ErrorKind::kInternal, "stacked matrices need equal column counts");
    if (part.range.begin < 0 || part.range.count <= 0 || part.range.begin + part.range.count > part.rows) {
      throw Error(ErrorKind::kInternal, "row range of tensor '" + part.name + "' out of bounds");
    }
    rows += part.range.count;
  }
  // Dummy weights on a device: each part drawn in place at its offset.
  std::vector<std::optional<RandomRecipe>> recipes;
  for (const RowPart& part : parts) recipes.push_back(backend_.host_memory() ? std::nullopt : source_.random_recipe(part.name));
  if (std::all_of(recipes.begin(), recipes.end(), [&](const auto& r) { return r && r->dtype == recipes.front()->dtype; })) {
    WeightMatrix w{nullptr, storage_type(recipes.front()->dtype), rows, cols, 0};
    w.row_bytes = *dtype_row_bytes(w.type, cols);
    auto buffer = backend_.allocate(static_cast<size_t>(rows * w.row_bytes));
    int64_t offset = 0;
    bool filled = true;
    for (size_t i = 0; i < parts.size() && filled; ++i) {
      const RowPart& part = parts[i];
      if (recipes[i]->shape != std::vector<int64_t>{part.rows, part.cols}) {
        throw_format(source_.path(), "tensor '" + part.name + "' has shape " + shape_str(recipes[i]->shape) +
                                         " but the model config implies " + shape_str({part.rows, part.cols}));
      }
      const uint64_t seed = recipes[i]->seed ^ (static_cast<uint64_t>(part.range.begin) << 32);
      filled = backend_.fill_random(static_cast<uint8_t*>(buffer->data()) + offset * w.row_bytes, w.type,
                                    part.range.count * cols, seed, recipes[i]->mean, recipes[i]->std);
      offset += part.range.count;
    }
    if (filled) {
      w.data = buffer->data();
      buffers_.push_back(std::move(buffer));
      return w;
    }
  }
  std::vector<uint8_t> bytes;
  DType type = DType::kF32;
  for (size_t i = 0; i < parts.size(); ++i) {
    const RowPart& part = parts[i];
    TensorRef t = require_matrix(part.name, part.rows, part.cols);
    const DType part_type = matrix_type(t.type);
    const DType stored = storage_type(part_type);
    if ((i > 0 && stored != storage_type(type)) || stored == DType::kFP8_E4M3_B128) {
      throw Error(ErrorKind::kInternal, "tensor '" + part.name + "' cannot be stacked with '" + parts.front().name +
                                            "' (check stackable() first)");
    }
    type = part_type;
    const int64_t row_bytes = *dtype_row_bytes(t.type, cols);
    const uint8_t* first = t.data + part.range.begin * row_bytes;
    if (part_type == DType::kFP8_E4M3_B128) {  // dequantized (stored is bf16)
      const std::vector<float> grid = block_scales(part.name, t);
      const BlockScales scales{grid.data() + part.range.begin / kFp8ScaleBlock * scale_blocks(cols), scale_blocks(cols),
                               part.range.begin % kFp8ScaleBlock};
      append_rows(part.name, part_type, stored, part.range.count, cols, first, row_bytes, bytes, &scales);
    } else {
      append_rows(part.name, t.type, stored, part.range.count, cols, first, row_bytes, bytes);
    }
    source_.copied(first, part.range.count * row_bytes);  // now in `bytes`
  }
  WeightMatrix w{nullptr, storage_type(type), rows, cols, 0};
  w.row_bytes = *dtype_row_bytes(w.type, cols);
  w.data = place(bytes.data(), bytes.size());
  return w;
}

TensorRef WeightLoader::require_matrix(const std::string& name, int64_t rows, int64_t cols) const {
  TensorRef t = require(name);
  if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols) {
    throw_format(source_.path(), "tensor '" + name + "' has shape " + shape_str(t.shape) + " but the model config implies " +
                                     shape_str({rows, cols}));
  }
  if (!dtype_row_bytes(t.type, cols)) {
    throw_format(source_.path(), "tensor '" + name + "' (" + std::string(dtype_name(t.type)) + ") rows of " + std::to_string(cols) +
                                     " values are not whole quant blocks");
  }
  return t;
}

WeightMatrix WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols) {
  return matrix_rows(name, rows, cols, SliceRange{0, rows});
}

WeightMatrix WeightLoader::matrix_rows(const std::string& name, int64_t rows, int64_t cols, SliceRange range) {
  // Dummy weights on a device backend are drawn there (stacked_rows generates in place).
  if (!backend_.host_memory() && source_.random_recipe(name)) return stacked_rows({RowPart{name, rows, cols, range}});
  TensorRef t = require_matrix(name, rows, cols);
  if (range.begin < 0 || range.count <= 0 || range.begin + range.count > rows) {
    throw Error(ErrorKind::kInternal, "row range of tensor '" + name + "' out of bounds");
  }
  const int64_t row_bytes = *dtype_row_bytes(t.type, cols);
  const uint8_t* first = t.data + range.begin * row_bytes;
  if (matrix_type(t.type) != DType::kFP8_E4M3_B128) return place_matrix(name, t.type, range.count, cols, first, row_bytes);
  const std::vector<float> grid = block_scales(name, t);
  const BlockScales scales{grid.data() + range.begin / kFp8ScaleBlock * scale_blocks(cols), scale_blocks(cols),
                           range.begin % kFp8ScaleBlock};
  return place_matrix(name, DType::kFP8_E4M3_B128, range.count, cols, first, row_bytes, &scales);
}

WeightMatrix WeightLoader::matrix_row_subset(const std::string& name, int64_t rows, int64_t cols,
                                             std::span<const int32_t> ids) {
  const TensorRef t = require_matrix(name, rows, cols);
  if (matrix_type(t.type) == DType::kFP8_E4M3_B128) {
    throw_unsupported(source_.path() + ": tensor '" + name + "': a row subset of block-scaled FP8 weights is not supported");
  }
  const int64_t row_bytes = *dtype_row_bytes(t.type, cols);
  std::vector<uint8_t> picked(ids.size() * static_cast<size_t>(row_bytes));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= rows) throw Error(ErrorKind::kInternal, "row id out of bounds in tensor '" + name + "'");
    std::memcpy(picked.data() + i * static_cast<size_t>(row_bytes), t.data + ids[i] * row_bytes, static_cast<size_t>(row_bytes));
  }
  check_storable(name, t.type, cols);
  WeightMatrix w;
  w.type = storage_type(t.type);
  w.rows = static_cast<int64_t>(ids.size());
  w.cols = cols;
  w.row_bytes = *dtype_row_bytes(w.type, cols);
  std::vector<uint8_t> stored;
  append_rows(name, t.type, w.type, w.rows, cols, picked.data(), row_bytes, stored, nullptr);
  w.data = place(stored.data(), stored.size());
  return w;
}

TensorRef WeightLoader::require_stacked(const std::string& name, int64_t n, int64_t rows, int64_t cols) const {
  TensorRef t = require(name);
  if (t.shape.size() != 3 || t.shape[0] != n || t.shape[1] != rows || t.shape[2] != cols) {
    throw_format(source_.path(), "tensor '" + name + "' has shape " + shape_str(t.shape) + " but the model config implies " +
                                     shape_str({n, rows, cols}));
  }
  if (!dtype_row_bytes(t.type, cols)) {
    throw_format(source_.path(), "tensor '" + name + "' (" + std::string(dtype_name(t.type)) + ") rows of " + std::to_string(cols) +
                                     " values are not whole quant blocks");
  }
  if (matrix_type(t.type) == DType::kFP8_E4M3_B128) {  // block scales are per 2-D matrix; no stacked file has them
    throw_unsupported(source_.path() + ": tensor '" + name + "': block-scaled FP8 in a stacked [n, rows, cols] tensor is not supported");
  }
  return t;
}

WeightMatrix WeightLoader::stacked_matrices(const std::string& name, int64_t n, int64_t rows, int64_t cols, SliceRange which) {
  TensorRef t = require_stacked(name, n, rows, cols);
  if (which.begin < 0 || which.count <= 0 || which.begin + which.count > n) {
    throw Error(ErrorKind::kInternal, "matrix range of tensor '" + name + "' out of bounds");
  }
  const int64_t row_bytes = *dtype_row_bytes(t.type, cols);
  return place_matrix(name, t.type, which.count * rows, cols, t.data + which.begin * rows * row_bytes, row_bytes);
}

WeightMatrix WeightLoader::stacked_matrix_part(const std::string& name, int64_t n, int64_t rows, int64_t cols, int64_t index,
                                               SliceRange row_range, SliceRange col_range) {
  TensorRef t = require_stacked(name, n, rows, cols);
  if (index < 0 || index >= n || row_range.begin < 0 || row_range.count <= 0 || row_range.begin + row_range.count > rows ||
      col_range.begin < 0 || col_range.count <= 0 || col_range.begin + col_range.count > cols) {
    throw Error(ErrorKind::kInternal, "part of tensor '" + name + "' out of bounds");
  }
  const int64_t row_bytes = *dtype_row_bytes(t.type, cols);
  const uint8_t* first = t.data + (index * rows + row_range.begin) * row_bytes + column_offset_bytes(name, t.type, cols, col_range);
  return place_matrix(name, t.type, row_range.count, col_range.count, first, row_bytes);
}

int64_t WeightLoader::column_offset_bytes(const std::string& name, DType type, int64_t cols, SliceRange range) const {
  const auto begin_bytes = dtype_row_bytes(type, range.begin);
  const auto slice_bytes = dtype_row_bytes(type, range.count);
  if (!begin_bytes || !slice_bytes) {
    throw_usage("tensor '" + name + "' (" + std::string(dtype_name(type)) + ") cannot be split by input columns for tp_size " +
                std::to_string(parallel_.tp_size) + " (ep_size " + std::to_string(parallel_.ep_size) + "): rank " +
                std::to_string(parallel_.tp_rank) + "'s columns [" + std::to_string(range.begin) + ", " +
                std::to_string(range.begin + range.count) + ") of " + std::to_string(cols) +
                " do not fall on its quant-block boundaries (" + std::to_string(dtype_info(type).block_size) + " values)");
  }
  return *begin_bytes;
}

WeightMatrix WeightLoader::matrix_cols(const std::string& name, int64_t rows, int64_t cols, SliceRange range) {
  if (range.begin < 0 || range.count <= 0 || range.begin + range.count > cols) {
    throw Error(ErrorKind::kInternal, "column range of tensor '" + name + "' out of bounds");
  }
  // Whole: as matrix(), which draws dummy weights on a device in place (the tensor is not generated here first).
  if (range.begin == 0 && range.count == cols) return matrix(name, rows, cols);
  TensorRef t = require_matrix(name, rows, cols);
  const int64_t begin_bytes = column_offset_bytes(name, t.type, cols, range);
  if (matrix_type(t.type) != DType::kFP8_E4M3_B128) {
    return place_matrix(name, t.type, rows, range.count, t.data + begin_bytes, *dtype_row_bytes(t.type, cols));
  }
  const int64_t end = range.begin + range.count;
  if (range.begin % kFp8ScaleBlock != 0 || (end % kFp8ScaleBlock != 0 && end != cols)) {
    throw_usage("tensor '" + name + "' (FP8 with 128x128 block scales) cannot be split by input columns for tp_size " +
                std::to_string(parallel_.tp_size) + ": rank " + std::to_string(parallel_.tp_rank) + "'s columns [" +
                std::to_string(range.begin) + ", " + std::to_string(end) + ") of " + std::to_string(cols) +
                " do not fall on its 128-column scale blocks");
  }
  const std::vector<float> grid = block_scales(name, t);
  const BlockScales scales{grid.data() + range.begin / kFp8ScaleBlock, scale_blocks(cols), 0};
  return place_matrix(name, DType::kFP8_E4M3_B128, rows, range.count, t.data + range.begin, cols, &scales);
}

std::vector<float> WeightLoader::block_scales(const std::string& name, const TensorRef& t) const {
  const std::vector<int64_t> expected{scale_blocks(t.shape[0]), scale_blocks(t.shape[1])};
  const std::optional<TensorRef> s = source_.find(block_scale_name(name));
  if (!s) {
    throw_format(source_.path(), "FP8 tensor '" + t.name + "' " + shape_str(t.shape) + " has no block scales '" +
                                     block_scale_name(t.name) + "' (servetune reads FP8 weights with 128x128 block "
                                     "scales, as DeepSeek-V3 ships them: F32 " + shape_str(expected) + ")");
  }
  if (s->shape != expected) {
    throw_format(source_.path(), "scale tensor '" + s->name + "' has shape " + shape_str(s->shape) + " but FP8 tensor '" +
                                     t.name + "' " + shape_str(t.shape) + " in 128x128 blocks needs " + shape_str(expected));
  }
  if (s->type != DType::kF32 && s->type != DType::kBF16 && s->type != DType::kF16) {
    throw_format(source_.path(), "scale tensor '" + s->name + "' has type " + std::string(dtype_name(s->type)) +
                                     "; block scales must be F32 (or BF16 / F16)");
  }
  std::vector<float> values(static_cast<size_t>(expected[0] * expected[1]));
  dequantize_row(s->type, s->data, values.data(), static_cast<int64_t>(values.size()));
  return values;
}

BlockScales WeightLoader::place_scales(const BlockScales& host, int64_t rows, int64_t cols) {
  const std::vector<float> packed = pack_block_scales(host, rows, cols);
  return {static_cast<const float*>(place(packed.data(), packed.size() * sizeof(float))), fp8_scale_stride(cols),
          host.row_offset};
}

const float* WeightLoader::vector(const std::string& name, int64_t n) { return vector(name, n, SliceRange{0, n}); }

const float* WeightLoader::vector(const std::string& name, int64_t n, SliceRange range) {
  std::vector<float> values;
  append_vector(name, n, range, values);
  if (host_view_) return host_view_;
  return static_cast<const float*>(place(values.data(), values.size() * sizeof(float)));
}

const float* WeightLoader::stacked_vectors(const std::vector<VectorPart>& parts) {
  std::vector<float> values;
  for (const VectorPart& part : parts) {
    append_vector(part.name, part.n, part.range, values);
    host_view_ = nullptr;
  }
  return static_cast<const float*>(place(values.data(), values.size() * sizeof(float)));
}

void WeightLoader::append_vector(const std::string& name, int64_t n, SliceRange range, std::vector<float>& out) {
  host_view_ = nullptr;
  TensorRef t = require(name);
  if (t.shape.size() != 1 || t.shape[0] != n) {
    throw_format(source_.path(), "tensor '" + name + "' has shape " + shape_str(t.shape) + " but the model config implies [" +
                                     std::to_string(n) + "]");
  }
  if (!can_dequantize(t.type)) {
    throw_unsupported(source_.path() + ": tensor '" + name + "' has type " + std::string(dtype_name(t.type)) + ", which cannot be converted to f32");
  }
  if (range.begin < 0 || range.count <= 0 || range.begin + range.count > n) {
    throw Error(ErrorKind::kInternal, "range of tensor '" + name + "' out of bounds");
  }
  if (t.type == DType::kF32 && backend_.host_memory()) {
    host_view_ = reinterpret_cast<const float*>(t.data) + range.begin;  // usable in place
    out.insert(out.end(), host_view_, host_view_ + range.count);
    return;
  }
  std::vector<float> values(static_cast<size_t>(n));
  dequantize_row(t.type, t.data, values.data(), n);
  out.insert(out.end(), values.begin() + range.begin, values.begin() + range.begin + range.count);
}

}  // namespace servetune
