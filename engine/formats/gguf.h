// GGUF reader (versions 2 and 3): metadata of every value type, tensor infos, alignment; tensor data is read
// in place from a memory map (no copies). Every size and offset is checked; a bad file throws Error(kFormat)
// naming the file and the problem.
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

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Arrays keep their elements: numbers as raw little-endian bytes in the mapping,
// strings as views into the mapping, nested arrays as child values.
class GgufValue {
 public:
  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::kArray; }

  // Scalars. Integers convert when the value fits; floats accept any numeric type.
  std::optional<int64_t> as_int() const;
  std::optional<double> as_float() const;
  std::optional<bool> as_bool() const;
  std::optional<std::string_view> as_string() const;

  // Arrays.
  GgufType elem_type() const { return elem_type_; }
  uint64_t size() const { return count_; }
  GgufValue at(uint64_t i) const;  // element i as a scalar or nested array value (bounds-checked)
  const std::vector<std::string_view>& strings() const { return strings_; }

 private:
  friend class GgufParser;
  GgufType type_ = GgufType::kUint8;
  uint64_t bits_ = 0;  // scalar payload (raw little-endian, zero-extended)
  std::string_view str_;
  GgufType elem_type_ = GgufType::kUint8;
  uint64_t count_ = 0;
  const uint8_t* raw_ = nullptr;          // fixed-size array elements
  std::vector<std::string_view> strings_;  // string array elements
  std::vector<GgufValue> items_;           // nested array elements
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGML order: dims[0] is the contiguous (innermost) dimension
  uint32_t ggml_type = 0;
  DType dtype = DType::kF32;
  uint64_t offset = 0;  // relative to the data section
  int64_t n_bytes = 0;
  const uint8_t* data = nullptr;

  int64_t n_elements() const;
};

class GgufFile {
 public:
  // Maps and parses the file at `path`.
  explicit GgufFile(const std::string& path);
  // Parses bytes owned by the caller (they must outlive the object); `name` is used in error messages.
  GgufFile(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  // Typed lookups: nullopt when the key is absent; Error(kFormat) when present with the wrong type.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* tensor(std::string_view name) const;
  // MappedFile::drop_pages on the file's mapping; nothing for bytes the caller owns.
  void drop_pages(const uint8_t* p, size_t n) const;

 private:
  void parse(std::span<const uint8_t> bytes);

  std::string name_;
  std::unique_ptr<MappedFile> mapping_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace servetune
