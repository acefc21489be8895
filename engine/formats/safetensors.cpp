// safetensors parser and writer. The checks follow the reference (safetensors 0.8): header length <= 1e8 and
// inside the file, a JSON object, known dtypes, non-negative shapes whose byte size does not overflow and
// matches data_offsets, tensors covering the data section contiguously from 0 to its end.
#include "formats/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace servetune {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderSize = 100'000'000;  // the reference's MAX_HEADER_SIZE

// Every dtype the reference knows, in its declaration order (its writer sorts by this order, descending).
struct StDtype {
  std::string_view name;
  std::optional<DType> type;  // nullopt: valid safetensors dtype that servetune has no DType for
};
constexpr StDtype kStDtypes[] = {
    {"BOOL", std::nullopt},        {"F4", std::nullopt},          {"F6_E2M3", std::nullopt},
    {"F6_E3M2", std::nullopt},     {"U8", std::nullopt},          {"I8", DType::kI8},
    {"F8_E5M2", std::nullopt},     {"F8_E4M3", DType::kFP8_E4M3}, {"F8_E8M0", std::nullopt},
    {"F8_E4M3FNUZ", std::nullopt}, {"F8_E5M2FNUZ", std::nullopt}, {"I16", DType::kI16},
    {"U16", std::nullopt},         {"F16", DType::kF16},          {"BF16", DType::kBF16},
    {"I32", DType::kI32},          {"U32", std::nullopt},         {"F32", DType::kF32},
    {"C64", std::nullopt},         {"F64", DType::kF64},          {"I64", DType::kI64},
    {"U64", std::nullopt},
};

const StDtype* find_st_dtype(std::string_view name) {
  for (const StDtype& d : kStDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

int st_order(DType t) {
  for (size_t i = 0; i < std::size(kStDtypes); ++i) {
    if (kStDtypes[i].type == t) return static_cast<int>(i);
  }
  return -1;
}

std::string supported_list() {
  std::string out;
  for (const StDtype& d : kStDtypes) {
    if (d.type) out += (out.empty() ? "" : ", ") + std::string(d.name);
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Element count of `shape`, or nullopt on overflow of int64.
std::optional<int64_t> checked_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// Strips nlohmann's "[json.exception.parse_error.101] " prefix.
std::string json_message(const std::exception& e) {
  std::string m = e.what();
  if (m.rfind("[json.exception", 0) == 0) {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m = m.substr(close + 2);
  }
  return m;
}

// Parses the header JSON. Rejects, as the reference does, duplicate tensor names and duplicate fields in one
// entry (duplicate __metadata__ keys: the last wins), and nesting deeper than a header has (object -> entry ->
// shape), so hostile input cannot build deep trees.
json parse_header_json(std::string_view text, const std::string& file) {
  std::set<std::string> names, fields;
  std::string entry;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth >= 3) {
      throw_format(file, "header nests JSON deeper than a safetensors header (object, entry, shape)");
    }
    if (event == json::parse_event_t::object_start && depth == 1) fields.clear();
    if (event == json::parse_event_t::key && depth == 1) {
      entry = parsed.get<std::string>();
      if (!names.insert(entry).second) throw_format(file, "tensor '" + entry + "' appears twice in the header");
    }
    if (event == json::parse_event_t::key && depth == 2 && entry != "__metadata__" &&
        !fields.insert(parsed.get<std::string>()).second) {
      throw_format(file, "tensor '" + entry + "': duplicate key \"" + parsed.get<std::string>() + "\"");
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    throw_format(file, "header is not valid JSON: " + json_message(e));
  }
}

std::vector<int64_t> parse_shape(const json& v, const std::string& file, const std::string& ctx) {
  if (!v.is_array()) throw_format(file, ctx + "\"shape\" is missing or not an array");
  std::vector<int64_t> shape;
  for (const json& d : v) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw_format(file, ctx + "shape entry " + d.dump() + " is not a non-negative 64-bit integer");
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

struct Span {
  uint64_t begin, end;
  size_t index;
};

}  // namespace

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  const StDtype* d = find_st_dtype(name);
  return d ? d->type : std::nullopt;
}

std::string_view safetensors_dtype_name(DType t) {
  const int i = st_order(t);
  if (i < 0) throw_unsupported("safetensors cannot store tensor type " + std::string(dtype_name(t)));
  return kStDtypes[i].name;
}

int64_t SafetensorsTensor::n_elements() const { return checked_elements(shape).value_or(0); }

SafetensorsFile::SafetensorsFile(const std::string& path) : name_(path), mapping_(std::make_unique<MappedFile>(path)) {
  parse(mapping_->bytes());
}

SafetensorsFile::SafetensorsFile(std::span<const uint8_t> bytes, const std::string& name) : name_(name) {
  parse(bytes);
}

void SafetensorsFile::drop_pages(const uint8_t* p, size_t n) const {
  if (mapping_ != nullptr) mapping_->drop_pages(p, n);
}

const SafetensorsTensor* SafetensorsFile::tensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::parse(std::span<const uint8_t> bytes) {
  auto fail = [this](const std::string& what) { throw_format(name_, what); };
  if (bytes.size() < 8) {
    fail("file is " + std::to_string(bytes.size()) +
         " bytes, too short for the 8-byte header length of a safetensors file");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | bytes[static_cast<size_t>(i)];
  if (n > kMaxHeaderSize) {
    fail("header length " + std::to_string(n) + " exceeds the safetensors limit of " + std::to_string(kMaxHeaderSize) +
         " bytes (not a safetensors file?)");
  }
  if (n > bytes.size() - 8) {
    fail("header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(bytes.size()) +
         " bytes): truncated file");
  }
  header_size_ = n;
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<size_t>(n));
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    fail("header contains a NUL byte at offset " + std::to_string(8 + nul) + " (JSON cannot)");
  }
  const json header = parse_header_json(text, name_);
  if (!header.is_object()) fail("header is not a JSON object");

  const uint64_t data_size = bytes.size() - 8 - n;
  const uint8_t* data = bytes.data() + 8 + n;
  std::vector<Span> spans;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      if (entry.is_null()) continue;
      if (!entry.is_object()) fail("\"__metadata__\" is not an object of strings");
      for (const auto& [mk, mv] : entry.items()) {
        if (!mv.is_string()) fail("\"__metadata__\" value of '" + mk + "' is not a string");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string ctx = "tensor '" + key + "': ";
    if (!entry.is_object()) fail(ctx + "header entry is not an object");
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) fail(ctx + "\"dtype\" is missing or not a string");
    const StDtype* st = find_st_dtype(dt->get<std::string>());
    if (st == nullptr) fail(ctx + "unknown dtype \"" + dt->get<std::string>() + "\"");
    if (!st->type) {
      throw_unsupported(name_ + ": " + ctx + "dtype " + std::string(st->name) + " is not supported (servetune loads " +
                        supported_list() + ")");
    }
    SafetensorsTensor t;
    t.name = key;
    t.dtype = *st->type;
    auto sh = entry.find("shape");
    t.shape = parse_shape(sh == entry.end() ? json() : *sh, name_, ctx);
    auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      fail(ctx + "\"data_offsets\" is missing or not two non-negative integers");
    }
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (end < begin)
      fail(ctx + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] end before they begin");
    const std::optional<int64_t> elements = checked_elements(t.shape);
    const std::optional<int64_t> need = elements ? dtype_row_bytes(t.dtype, *elements) : std::nullopt;
    if (!need) fail(ctx + "shape " + shape_str(t.shape) + " of " + std::string(st->name) + " overflows 64-bit sizes");
    if (end - begin != static_cast<uint64_t>(*need)) {
      fail(ctx + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] hold " +
           std::to_string(end - begin) + " bytes but " + std::string(st->name) + " " + shape_str(t.shape) + " needs " +
           std::to_string(*need));
    }
    t.offset = begin;
    spans.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }

  // Tensors must tile the data section: sorted by offsets, each begins where the previous ended.
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Span& s : spans) {
    const std::string& name = tensors_[s.index].name;
    const std::string where = "[" + std::to_string(s.begin) + ", " + std::to_string(s.end) + "]";
    if (s.end > data_size) {
      fail("tensor '" + name + "': data_offsets " + where + " run past the end of the data section (" +
           std::to_string(data_size) + " bytes): truncated file or bad offsets");
    }
    if (s.begin < covered) fail("tensor '" + name + "': data_offsets " + where + " overlap tensor '" + *previous + "'");
    if (s.begin > covered) {
      fail("bytes [" + std::to_string(covered) + ", " + std::to_string(s.begin) +
           ") of the data section before tensor '" + name +
           "' belong to no tensor (safetensors requires contiguous data)");
    }
    covered = s.end;
    previous = &name;
  }
  if (covered != data_size) {
    fail("the data section has " + std::to_string(data_size) + " bytes but the tensors cover only " +
         std::to_string(covered) + " (trailing bytes)");
  }

  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(tensors_.size());
  for (const Span& s : spans) {
    SafetensorsTensor& t = tensors_[s.index];
    t.data = {data + s.begin, static_cast<size_t>(s.end - s.begin)};
    index_[t.name] = ordered.size();
    ordered.push_back(std::move(t));
  }
  tensors_ = std::move(ordered);
}

// ---- SafetensorsSet ----

SafetensorsSet::SafetensorsSet(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    const fs::path single = fs::path(path) / "model.safetensors";
    if (fs::exists(index, ec)) {
      open_index(index.string());
    } else if (fs::exists(single, ec)) {
      add_file(SafetensorsFile(single.string()));
    } else {
      throw_io(path, "directory has neither model.safetensors.index.json nor model.safetensors");
    }
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    open_index(path);
  } else {
    add_file(SafetensorsFile(path));
  }
  build_lookup();
}

void SafetensorsSet::open_index(const std::string& index_path) {
  namespace fs = std::filesystem;
  std::ifstream in(index_path, std::ios::binary);
  if (!in) throw_io(index_path, "cannot open");
  std::stringstream text;
  text << in.rdbuf();
  json index;
  try {
    index = json::parse(text.str());
  } catch (const json::exception& e) {
    throw_format(index_path, "not valid JSON: " + json_message(e));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw_format(index_path, "no \"weight_map\" object (not a safetensors index)");
  }
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) throw_format(index_path, "weight_map entry '" + tensor + "' is not a file name");
    const std::string file = shard.get<std::string>();
    const fs::path p(file);
    const bool escapes = std::any_of(p.begin(), p.end(), [](const fs::path& c) { return c == ".."; });
    if (file.empty() || p.is_absolute() || escapes) {
      throw_format(index_path, "weight_map puts tensor '" + tensor + "' in '" + file +
                                   "', which is not a file name inside the checkpoint directory");
    }
    by_shard[file].push_back(tensor);
  }
  const fs::path dir = fs::path(index_path).parent_path();
  for (const auto& [shard, tensors] : by_shard) {
    const fs::path shard_path = dir / shard;
    std::error_code ec;
    if (!fs::is_regular_file(shard_path, ec)) {
      throw_io(index_path, "shard '" + shard + "' (holding " + std::to_string(tensors.size()) + " tensors, e.g. '" +
                               tensors.front() + "') does not exist");
    }
    SafetensorsFile file(shard_path.string());
    for (const std::string& t : tensors) {
      if (file.tensor(t) == nullptr) {
        throw_format(index_path, "weight_map puts tensor '" + t + "' in '" + shard + "', which does not contain it");
      }
    }
    add_file(std::move(file));
  }
}

void SafetensorsSet::add_file(SafetensorsFile file) { files_.push_back(std::move(file)); }

void SafetensorsSet::build_lookup() {
  by_name_.clear();
  for (const SafetensorsFile& f : files_) {
    for (const SafetensorsTensor& t : f.tensors()) {
      const auto inserted = by_name_.emplace(t.name, &t);
      if (!inserted.second) {
        const SafetensorsTensor* first = inserted.first->second;
        const auto owner = std::find_if(files_.begin(), files_.end(),
                                        [&](const SafetensorsFile& g) { return g.tensor(t.name) == first; });
        throw_format(f.path(), "tensor '" + t.name + "' is also in " + owner->path());
      }
    }
  }
}

const SafetensorsTensor* SafetensorsSet::tensor(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(name);
  return out;
}

// ---- writer ----

namespace {

struct Prepared {
  std::string header;  // padded JSON
  std::vector<const SafetensorsWriteTensor*> order;
};

Prepared prepare(const std::vector<SafetensorsWriteTensor>& tensors,
                 const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const SafetensorsWriteTensor& t : tensors) {
    if (t.name == "__metadata__") throw_usage("safetensors: tensor name \"__metadata__\" is reserved");
    if (!names.insert(t.name).second) throw_usage("safetensors: tensor '" + t.name + "' given twice");
    const std::string_view st = safetensors_dtype_name(t.dtype);
    const std::optional<int64_t> n = checked_elements(t.shape);
    const std::optional<int64_t> bytes = n ? dtype_row_bytes(t.dtype, *n) : std::nullopt;
    if (!bytes || static_cast<uint64_t>(*bytes) != t.data.size()) {
      throw_usage("safetensors: tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
                  " bytes, which does not match " + std::string(st) + " " + shape_str(t.shape));
    }
  }
  Prepared p;
  for (const SafetensorsWriteTensor& t : tensors) p.order.push_back(&t);
  std::sort(p.order.begin(), p.order.end(), [](const SafetensorsWriteTensor* a, const SafetensorsWriteTensor* b) {
    const int oa = st_order(a->dtype), ob = st_order(b->dtype);
    return oa != ob ? oa > ob : a->name < b->name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsWriteTensor* t : p.order) {
    nlohmann::ordered_json entry;
    entry["dtype"] = safetensors_dtype_name(t->dtype);
    entry["shape"] = t->shape;
    entry["data_offsets"] = {offset, offset + t->data.size()};
    header[t->name] = std::move(entry);
    offset += t->data.size();
  }
  try {
    p.header = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw_usage("safetensors: cannot encode the header: " + json_message(e));
  }
  p.header.append((8 - p.header.size() % 8) % 8, ' ');
  return p;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

}  // namespace

std::vector<uint8_t> safetensors_bytes(const std::vector<SafetensorsWriteTensor>& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  const Prepared p = prepare(tensors, metadata);
  const std::string head = le64(p.header.size()) + p.header;
  std::vector<uint8_t> out(head.begin(), head.end());
  for (const SafetensorsWriteTensor* t : p.order) out.insert(out.end(), t->data.begin(), t->data.end());
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const Prepared p = prepare(tensors, metadata);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw_io(tmp, std::string("cannot create: ") + std::strerror(errno));
  const std::string head = le64(p.header.size()) + p.header;
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  for (const SafetensorsWriteTensor* t : p.order) {
    ok = ok && (t->data.empty() || std::fwrite(t->data.data(), 1, t->data.size(), f) == t->data.size());
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw_io(path, std::string("cannot write: ") + std::strerror(err));
  }
}

void write_safetensors_index(const std::string& path, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size) {
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = weight_map;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << index.dump(2) << "\n";
  out.close();
  if (!out) throw_io(path, "cannot write");
}

}  // namespace servetune
