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

WeightMatrix WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols, Shard shard) {
  TensorRef t = require(name);
  if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols) {
    throw_format(source_.path(), "tensor '" + name + "' has shape " + shape_str(t.shape) + " but the model config implies " +
                                     shape_str({rows, cols}));
  }
  const int64_t split = shard == Shard::kRows ? rows : shard == Shard::kCols ? cols : 0;
  if (shard != Shard::kNone && split % parallel_.tp_size != 0) {
    throw_usage("tensor '" + name + "' dimension " + std::to_string(split) + " does not divide by tp_size " +
                std::to_string(parallel_.tp_size));
  }
  WeightMatrix w;
  w.type = t.type;
  w.rows = shard == Shard::kRows ? parallel_.local(rows) : rows;
  w.cols = shard == Shard::kCols ? parallel_.local(cols) : cols;
  auto row_bytes = dtype_row_bytes(t.type, w.cols);
  if (!row_bytes) {
    throw_usage("tensor '" + name + "' (" + std::string(dtype_name(t.type)) + ") cannot be split into " +
                std::to_string(parallel_.tp_size) + " column shards of " + std::to_string(w.cols) + " (block size " +
                std::to_string(dtype_info(t.type).block_size) + ")");
  }
  w.row_bytes = *row_bytes;
  const int64_t full_row_bytes = *dtype_row_bytes(t.type, cols);
  const int64_t row0 = shard == Shard::kRows ? parallel_.begin(rows) : 0;
  const int64_t col_byte0 = shard == Shard::kCols ? *dtype_row_bytes(t.type, parallel_.begin(cols)) : 0;
  const uint8_t* first = t.data + row0 * full_row_bytes;
  if (shard != Shard::kCols || parallel_.tp_size == 1) {
    const size_t bytes = static_cast<size_t>(w.rows * w.row_bytes);
    w.data = backend_.host_memory() ? static_cast<const void*>(first) : place(first, bytes);
    return w;
  }
  std::vector<uint8_t> slice(static_cast<size_t>(w.rows * w.row_bytes));
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(slice.data() + r * w.row_bytes, first + r * full_row_bytes + col_byte0, static_cast<size_t>(w.row_bytes));
  }
  w.data = place(slice.data(), slice.size());
  return w;
}

const float* WeightLoader::vector(const std::string& name, int64_t n, Shard shard) {
  TensorRef t = require(name);
  if (t.shape.size() != 1 || t.shape[0] != n) {
    throw_format(source_.path(), "tensor '" + name + "' has shape " + shape_str(t.shape) + " but the model config implies [" +
                                     std::to_string(n) + "]");
  }
  if (!can_dequantize(t.type)) {
    throw_unsupported(source_.path() + ": tensor '" + name + "' has type " + std::string(dtype_name(t.type)) + ", which cannot be converted to f32");
  }
  const int64_t begin = shard == Shard::kRows ? parallel_.begin(n) : 0;
  const int64_t count = shard == Shard::kRows ? parallel_.local(n) : n;
  if (t.type == DType::kF32 && backend_.host_memory()) return reinterpret_cast<const float*>(t.data) + begin;
  std::vector<float> values(static_cast<size_t>(n));
  dequantize_row(t.type, t.data, values.data(), n);
  return static_cast<const float*>(place(values.data() + begin, static_cast<size_t>(count) * sizeof(float)));
}

}  // namespace servetune
