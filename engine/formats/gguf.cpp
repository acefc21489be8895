// GGUF parser: a bounds-checked cursor over the mapped bytes; limits keep hostile counts from allocating memory.
#include "formats/gguf.h"

#include <cstring>

#include "core/error.h"

namespace servetune {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxDims = 4;             // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxStringLen = 1ull << 30;
constexpr int64_t kMaxElements = int64_t{1} << 50;

size_t fixed_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view kNames[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32", "float32",
                                                "bool",  "string", "array",  "uint64", "int64",  "float64"};
  auto i = static_cast<uint32_t>(t);
  return i < std::size(kNames) ? kNames[i] : std::string_view("invalid");
}

// Reads GGUF structures from a byte span; every read checks the remaining length.
class GgufParser {
 public:
  GgufParser(std::span<const uint8_t> bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  [[noreturn]] void fail(const std::string& what) const { throw_format(name_, what); }

  const uint8_t* take(size_t n, const char* what) {
    if (n > remaining()) {
      fail(std::string("truncated file: need ") + std::to_string(n) + " bytes for " + what + " at offset " +
           std::to_string(pos_) + ", but only " + std::to_string(remaining()) + " remain");
    }
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }

  template <typename T>
  T read(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }

  std::string_view read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    if (len > kMaxStringLen || len > remaining()) {
      fail(std::string("string length ") + std::to_string(len) + " for " + what + " at offset " +
           std::to_string(pos_ - 8) + " runs past the end of the file");
    }
    const uint8_t* p = take(len, what);
    return {reinterpret_cast<const char*>(p), static_cast<size_t>(len)};
  }

  GgufValue read_value(GgufType type, const std::string& key, int depth) {
    GgufValue v;
    v.type_ = type;
    if (type == GgufType::kString) {
      v.str_ = read_string(key.c_str());
      return v;
    }
    if (type == GgufType::kArray) {
      if (depth >= kMaxArrayDepth) fail("metadata '" + key + "': arrays nested deeper than " + std::to_string(kMaxArrayDepth));
      uint32_t elem = read<uint32_t>(key.c_str());
      if (!valid_type(elem)) fail("metadata '" + key + "': unknown array element type " + std::to_string(elem));
      v.elem_type_ = static_cast<GgufType>(elem);
      v.count_ = read<uint64_t>(key.c_str());
      // Every element takes at least one byte (strings and arrays at least eight), so the count is bounded by the file.
      size_t min_size = fixed_size(v.elem_type_);
      if (min_size == 0) min_size = 8;
      if (v.count_ > remaining() / min_size) {
        fail("metadata '" + key + "': array of " + std::to_string(v.count_) + " elements runs past the end of the file");
      }
      if (fixed_size(v.elem_type_) != 0) {
        v.raw_ = take(v.count_ * fixed_size(v.elem_type_), key.c_str());
      } else if (v.elem_type_ == GgufType::kString) {
        v.strings_.reserve(v.count_);
        for (uint64_t i = 0; i < v.count_; ++i) v.strings_.push_back(read_string(key.c_str()));
      } else {
        v.items_.reserve(v.count_);
        for (uint64_t i = 0; i < v.count_; ++i) v.items_.push_back(read_value(GgufType::kArray, key, depth + 1));
      }
      return v;
    }
    size_t n = fixed_size(type);
    if (n == 0) fail("metadata '" + key + "': unknown value type " + std::to_string(static_cast<uint32_t>(type)));
    std::memcpy(&v.bits_, take(n, key.c_str()), n);
    return v;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  size_t pos_ = 0;
};

std::optional<int64_t> GgufValue::as_int() const {
  switch (type_) {
    case GgufType::kUint8:
      return static_cast<uint8_t>(bits_);
    case GgufType::kInt8:
      return static_cast<int8_t>(bits_);
    case GgufType::kUint16:
      return static_cast<uint16_t>(bits_);
    case GgufType::kInt16:
      return static_cast<int16_t>(bits_);
    case GgufType::kUint32:
      return static_cast<uint32_t>(bits_);
    case GgufType::kInt32:
      return static_cast<int32_t>(bits_);
    case GgufType::kInt64:
      return static_cast<int64_t>(bits_);
    case GgufType::kUint64:
      if (bits_ > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
      return static_cast<int64_t>(bits_);
    default:
      return std::nullopt;
  }
}

std::optional<double> GgufValue::as_float() const {
  if (type_ == GgufType::kFloat32) {
    float f;
    uint32_t b = static_cast<uint32_t>(bits_);
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (type_ == GgufType::kFloat64) {
    double d;
    std::memcpy(&d, &bits_, 8);
    return d;
  }
  if (auto i = as_int()) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> GgufValue::as_bool() const {
  if (type_ != GgufType::kBool) return std::nullopt;
  return bits_ != 0;
}

std::optional<std::string_view> GgufValue::as_string() const {
  if (type_ != GgufType::kString) return std::nullopt;
  return str_;
}

GgufValue GgufValue::at(uint64_t i) const {
  if (type_ != GgufType::kArray || i >= count_) throw Error(ErrorKind::kInternal, "GGUF array index out of range");
  if (elem_type_ == GgufType::kString) {
    GgufValue v;
    v.type_ = GgufType::kString;
    v.str_ = strings_[i];
    return v;
  }
  if (elem_type_ == GgufType::kArray) return items_[i];
  GgufValue v;
  v.type_ = elem_type_;
  size_t n = fixed_size(elem_type_);
  std::memcpy(&v.bits_, raw_ + i * n, n);
  return v;
}

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

GgufFile::GgufFile(const std::string& path) : name_(path), mapping_(std::make_unique<MappedFile>(path)) {
  parse(mapping_->bytes());
}

GgufFile::GgufFile(std::span<const uint8_t> bytes, const std::string& name) : name_(name) { parse(bytes); }

void GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufParser p(bytes, name_);
  if (bytes.size() < 4) p.fail("not a GGUF file: too short (" + std::to_string(bytes.size()) + " bytes)");
  uint32_t magic = p.read<uint32_t>("magic");
  if (magic != kGgufMagic) p.fail("not a GGUF file: bad magic (expected 'GGUF')");
  version_ = p.read<uint32_t>("version");
  if (version_ == 1) p.fail("GGUF version 1 is not supported (only versions 2 and 3)");
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xFFFF) == 0 && version_ != 0) p.fail("big-endian GGUF files are not supported");
    p.fail("unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  }
  uint64_t n_tensors = p.read<uint64_t>("tensor count");
  uint64_t n_kv = p.read<uint64_t>("metadata count");
  // Each key-value pair takes at least 12 bytes and each tensor info at least 24.
  if (n_kv > p.remaining() / 12) p.fail("metadata count " + std::to_string(n_kv) + " is larger than the file can hold");
  if (n_tensors > p.remaining() / 24) p.fail("tensor count " + std::to_string(n_tensors) + " is larger than the file can hold");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key(p.read_string("metadata key"));
    uint32_t type = p.read<uint32_t>("metadata value type");
    if (!valid_type(type)) p.fail("metadata '" + key + "': unknown value type " + std::to_string(type));
    GgufValue value = p.read_value(static_cast<GgufType>(type), key, 0);
    if (!metadata_.emplace(key, std::move(value)).second) p.fail("duplicate metadata key '" + key + "'");
  }

  if (const GgufValue* a = find("general.alignment")) {
    auto v = a->as_int();
    if (!v || *v <= 0 || (*v & (*v - 1)) != 0 || *v > (1 << 20)) {
      p.fail("general.alignment must be a positive power of two, got " + (v ? std::to_string(*v) : std::string("a non-integer")));
    }
    alignment_ = static_cast<uint64_t>(*v);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = std::string(p.read_string("tensor name"));
    uint32_t n_dims = p.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims) {
      p.fail("tensor '" + t.name + "': " + std::to_string(n_dims) + " dimensions (must be 1.." + std::to_string(kMaxDims) + ")");
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = p.read<uint64_t>("tensor dimension");
      if (dim == 0 || dim > static_cast<uint64_t>(kMaxElements) ||
          __builtin_mul_overflow(n_elements, static_cast<int64_t>(dim), &n_elements) || n_elements > kMaxElements) {
        p.fail("tensor '" + t.name + "': absurd dimension " + std::to_string(dim));
      }
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    t.ggml_type = p.read<uint32_t>("tensor type");
    auto dtype = dtype_from_ggml(t.ggml_type);
    if (!dtype) {
      p.fail("tensor '" + t.name + "' has type " + ggml_type_name(t.ggml_type) +
             ", which servetune does not support (supported: F32 F16 BF16 F64 I8 I16 I32 I64 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K)");
    }
    t.dtype = *dtype;
    auto row_bytes = dtype_row_bytes(t.dtype, t.dims[0]);
    if (!row_bytes) {
      p.fail("tensor '" + t.name + "': row length " + std::to_string(t.dims[0]) + " is not a multiple of the " +
             std::string(dtype_name(t.dtype)) + " block size " + std::to_string(dtype_info(t.dtype).block_size));
    }
    int64_t rows = n_elements / t.dims[0];
    if (__builtin_mul_overflow(*row_bytes, rows, &t.n_bytes)) p.fail("tensor '" + t.name + "': size overflows");
    t.offset = p.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0) {
      p.fail("tensor '" + t.name + "': offset " + std::to_string(t.offset) + " is not aligned to " + std::to_string(alignment_));
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) p.fail("duplicate tensor name '" + t.name + "'");
    tensors_.push_back(std::move(t));
  }

  uint64_t header_end = p.pos();
  data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_offset_ > bytes.size()) p.fail("truncated file: tensor data section is missing");
  uint64_t data_size = bytes.size() - std::min<uint64_t>(data_offset_, bytes.size());
  for (GgufTensorInfo& t : tensors_) {
    uint64_t n = static_cast<uint64_t>(t.n_bytes);
    if (t.offset > data_size || n > data_size - t.offset) {
      p.fail("tensor '" + t.name + "': data [" + std::to_string(t.offset) + ", " + std::to_string(t.offset + n) +
             ") runs past the end of the data section (" + std::to_string(data_size) + " bytes); the file is truncated or corrupt");
    }
    t.data = bytes.data() + data_offset_ + t.offset;
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  auto i = v->as_int();
  if (!i) throw_format(name_, "metadata '" + std::string(key) + "' should be an integer, found " + std::string(gguf_type_name(v->type())));
  return i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  auto f = v->as_float();
  if (!f) throw_format(name_, "metadata '" + std::string(key) + "' should be a number, found " + std::string(gguf_type_name(v->type())));
  return f;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  auto b = v->as_bool();
  if (!b) throw_format(name_, "metadata '" + std::string(key) + "' should be a bool, found " + std::string(gguf_type_name(v->type())));
  return b;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  auto s = v->as_string();
  if (!s) throw_format(name_, "metadata '" + std::string(key) + "' should be a string, found " + std::string(gguf_type_name(v->type())));
  return std::string(*s);
}

void GgufFile::drop_pages(const uint8_t* p, size_t n) const {
  if (mapping_ != nullptr) mapping_->drop_pages(p, n);
}

const GgufTensorInfo* GgufFile::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace servetune
