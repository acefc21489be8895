// safetensors reader (memory-mapped, tensors are views into the mapping), sharded checkpoints through
// model.safetensors.index.json, and a writer whose output is byte-identical to the `safetensors` package's.
// Validation mirrors the reference implementation: a bad file throws one Error(kFormat) naming it and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace servetune {

// safetensors dtype strings <-> DType (F64 F32 F16 BF16 F8_E4M3 I64 I32 I16 I8). Other strings give nullopt.
std::optional<DType> dtype_from_safetensors(std::string_view name);
// "F32", ...; Error(kUnsupported) for DTypes safetensors cannot store (the GGML block types).
std::string_view safetensors_dtype_name(DType t);

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;     // row-major: shape.back() is the contiguous dimension
  std::span<const uint8_t> data;  // view into the file; alignment is whatever the file gives (8 + header length)
  uint64_t offset = 0;            // of data, relative to the data section

  int64_t n_elements() const;
};

class SafetensorsFile {
 public:
  // Maps and parses the file at `path`. Throws Error(kIo) if it cannot be read, Error(kFormat) if it is not a
  // valid safetensors file, Error(kUnsupported) for a tensor of a valid dtype servetune has no DType for (U8, BOOL...).
  explicit SafetensorsFile(const std::string& path);
  // Parses bytes owned by the caller (they must outlive the object); `name` is used in error messages.
  SafetensorsFile(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return name_; }
  uint64_t header_size() const { return header_size_; }  // JSON bytes after the 8-byte length
  uint64_t data_offset() const { return 8 + header_size_; }

  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in data-offset order
  const SafetensorsTensor* tensor(std::string_view name) const;               // nullptr when absent
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  // MappedFile::drop_pages on the file's mapping; nothing for bytes the caller owns.
  void drop_pages(const uint8_t* p, size_t n) const;

 private:
  void parse(std::span<const uint8_t> bytes);

  std::string name_;
  std::unique_ptr<MappedFile> mapping_;
  uint64_t header_size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

// A checkpoint of one or more safetensors files. `path` may be
//   - a directory holding model.safetensors.index.json (sharded) or model.safetensors,
//   - an index file (*.json) whose "weight_map" maps tensor names to shard files in the same directory,
//   - a single .safetensors file.
// Every shard is opened and validated; the index must agree with the shards (each mapped tensor is in its
// shard) and no tensor may appear in two shards.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& path);

  const std::vector<SafetensorsFile>& files() const { return files_; }
  const SafetensorsTensor* tensor(std::string_view name) const;  // nullptr when absent
  std::vector<std::string> names() const;                        // sorted
  size_t size() const { return by_name_.size(); }

 private:
  void open_index(const std::string& index_path);
  void add_file(SafetensorsFile file);
  void build_lookup();

  std::vector<SafetensorsFile> files_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> by_name_;
};

struct SafetensorsWriteTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;  // exactly n_elements * element size bytes, little-endian
};

// Serializes as the safetensors package does: `__metadata__` first, tensors ordered by descending dtype
// (the package's alignment order) then name, contiguous data, header padded with spaces to a multiple of 8.
// Throws Error(kUsage) for duplicate or reserved names, a size that does not match the shape, or a dtype
// safetensors cannot store.
std::vector<uint8_t> safetensors_bytes(const std::vector<SafetensorsWriteTensor>& tensors,
                                       const std::map<std::string, std::string>& metadata = {});
// Streams the same bytes to `path` (through a temporary file renamed into place); Error(kIo) on failure.
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Writes a model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {tensor: shard}}.
void write_safetensors_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size);

}  // namespace servetune
