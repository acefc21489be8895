// Sharding-aware weight loading (see weight_loader.h).
#include "model/weight_loader.h"

#include <cstring>
#include <sstream>

#include "core/error.h"
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

}  // namespace

WeightLoader::WeightLoader(const WeightSource& source, Backend& backend, ParallelContext parallel)
    : source_(source), backend_(backend), parallel_(parallel) {}

TensorRef WeightLoader::require(const std::string& name) const {
  auto t = source_.find(name);
  if (!t) throw_format(source_.path(), "missing tensor '" + name + "'");
  return *t;
}

const void* WeightLoader::place(const void* host, size_t bytes) {
  auto buffer = backend_.allocate(bytes);
  backend_.upload(*buffer, 0, host, bytes);
  const void* p = buffer->data();
  buffers_.push_back(std::move(buffer));
  return p;
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
  TensorRef t = require_matrix(name, rows, cols);
  if (range.begin < 0 || range.count <= 0 || range.begin + range.count > rows) {
    throw Error(ErrorKind::kInternal, "row range of tensor '" + name + "' out of bounds");
  }
  WeightMatrix w;
  w.type = t.type;
  w.rows = range.count;
  w.cols = cols;
  w.row_bytes = *dtype_row_bytes(t.type, cols);
  const uint8_t* first = t.data + range.begin * w.row_bytes;
  const size_t bytes = static_cast<size_t>(w.rows * w.row_bytes);
  w.data = backend_.host_memory() ? static_cast<const void*>(first) : place(first, bytes);
  return w;
}

WeightMatrix WeightLoader::matrix_cols(const std::string& name, int64_t rows, int64_t cols, SliceRange range) {
  TensorRef t = require_matrix(name, rows, cols);
  if (range.begin < 0 || range.count <= 0 || range.begin + range.count > cols) {
    throw Error(ErrorKind::kInternal, "column range of tensor '" + name + "' out of bounds");
  }
  if (range.begin == 0 && range.count == cols) return matrix(name, rows, cols);
  const auto begin_bytes = dtype_row_bytes(t.type, range.begin);
  const auto slice_bytes = dtype_row_bytes(t.type, range.count);
  if (!begin_bytes || !slice_bytes) {
    throw_usage("tensor '" + name + "' (" + std::string(dtype_name(t.type)) + ") cannot be split by input columns for tp_size " +
                std::to_string(parallel_.tp_size) + ": rank " + std::to_string(parallel_.tp_rank) + "'s columns [" +
                std::to_string(range.begin) + ", " + std::to_string(range.begin + range.count) + ") of " + std::to_string(cols) +
                " do not fall on its quant-block boundaries (" + std::to_string(dtype_info(t.type).block_size) + " values)");
  }
  WeightMatrix w;
  w.type = t.type;
  w.rows = rows;
  w.cols = range.count;
  w.row_bytes = *slice_bytes;
  const int64_t full_row_bytes = *dtype_row_bytes(t.type, cols);
  std::vector<uint8_t> slice(static_cast<size_t>(w.rows * w.row_bytes));
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(slice.data() + r * w.row_bytes, t.data + r * full_row_bytes + *begin_bytes, static_cast<size_t>(w.row_bytes));
  }
  w.data = place(slice.data(), slice.size());
  return w;
}

const float* WeightLoader::vector(const std::string& name, int64_t n) { return vector(name, n, SliceRange{0, n}); }

const float* WeightLoader::vector(const std::string& name, int64_t n, SliceRange range) {
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
  if (t.type == DType::kF32 && backend_.host_memory()) return reinterpret_cast<const float*>(t.data) + range.begin;
  std::vector<float> values(static_cast<size_t>(n));
  dequantize_row(t.type, t.data, values.data(), n);
  return static_cast<const float*>(place(values.data() + range.begin, static_cast<size_t>(range.count) * sizeof(float)));
}

}  // namespace servetune
