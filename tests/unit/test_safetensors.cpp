// safetensors reader/writer: files written by the reference package (tests/data/safetensors, made by
// scripts/gen_format_goldens.py), byte-identical writer output, sharded sets, and corrupt inputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "test_paths.h"

namespace servetune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
  return out;
}

json expected() {
  std::ifstream in(testing::data_path("safetensors/python_written.expected.json"));
  return json::parse(in);
}

std::vector<uint8_t> file_from_header(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

// Parses `bytes` expecting one Error; returns "<kind>|<message>".
std::string parse_error(const std::vector<uint8_t>& bytes, ErrorKind want = ErrorKind::kFormat) {
  try {
    SafetensorsFile f(bytes, "bad.safetensors");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), want) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("bad.safetensors: ", 0), 0u) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "parsed without error";
  return "";
}

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() /
              ("servetune_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(Safetensors, DtypeNames) {
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kFP8_E4M3);
  EXPECT_EQ(dtype_from_safetensors("U8"), std::nullopt);
  EXPECT_EQ(dtype_from_safetensors("f32"), std::nullopt);
  EXPECT_EQ(safetensors_dtype_name(DType::kI64), "I64");
  EXPECT_THROW(safetensors_dtype_name(DType::kQ4_0), Error);
}

TEST(Safetensors, ReadsFileWrittenByReference) {
  const json want = expected();
  SafetensorsFile f(testing::data_path("safetensors/python_written.safetensors"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.data_offset() % 8, 0u);
  ASSERT_EQ(f.tensors().size(), want["tensors"].size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const SafetensorsTensor& t = f.tensors()[i];
    const json& w = want["tensors"][i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, w["name"].get<std::string>());
    EXPECT_EQ(safetensors_dtype_name(t.dtype), w["dtype"].get<std::string>());
    EXPECT_EQ(t.shape, w["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.offset, w["data_offsets"][0].get<uint64_t>());
    EXPECT_EQ(std::vector<uint8_t>(t.data.begin(), t.data.end()), from_hex(w["data"].get<std::string>()));
    EXPECT_EQ(f.tensor(t.name), &t);
  }
  EXPECT_EQ(f.tensor("temperature")->shape.size(), 0u);
  EXPECT_EQ(f.tensor("temperature")->n_elements(), 1);
  EXPECT_EQ(f.tensor("empty")->n_elements(), 0);
  EXPECT_EQ(f.tensor("missing"), nullptr);
  float first;
  std::memcpy(&first, f.tensor("model.embed_tokens.weight")->data.data() + 4, 4);
  EXPECT_EQ(first, 0.5f);
}

std::vector<SafetensorsWriteTensor> reference_tensors(const json& want, std::vector<std::vector<uint8_t>>& storage) {
  std::vector<SafetensorsWriteTensor> out;
  storage.reserve(want["tensors"].size());
  // Reverse order: the writer must sort as the reference does.
  for (auto it = want["tensors"].rbegin(); it != want["tensors"].rend(); ++it) {
    storage.push_back(from_hex((*it)["data"].get<std::string>()));
    out.push_back({(*it)["name"].get<std::string>(), *dtype_from_safetensors((*it)["dtype"].get<std::string>()),
                   (*it)["shape"].get<std::vector<int64_t>>(), storage.back()});
  }
  return out;
}

TEST(Safetensors, WriterIsByteIdenticalToReference) {
  const json want = expected();
  std::vector<std::vector<uint8_t>> storage;
  const auto tensors = reference_tensors(want, storage);
  const std::vector<uint8_t> reference = read_bytes(testing::data_path("safetensors/python_written.safetensors"));
  EXPECT_EQ(safetensors_bytes(tensors, {{"format", "pt"}}), reference);

  TempDir dir;
  write_safetensors(dir.file("out.safetensors"), tensors, {{"format", "pt"}});
  EXPECT_EQ(read_bytes(dir.file("out.safetensors")), reference);
  EXPECT_FALSE(fs::exists(dir.file("out.safetensors.tmp")));
  SafetensorsFile back(dir.file("out.safetensors"));
  EXPECT_EQ(back.tensors().size(), tensors.size());

  // Empty file as the reference writes it: "{}" padded to 8 bytes.
  const std::vector<uint8_t> empty = safetensors_bytes({});
  EXPECT_EQ(std::string(empty.begin() + 8, empty.end()), "{}      ");
  EXPECT_EQ(SafetensorsFile(empty, "empty").tensors().size(), 0u);
}

TEST(Safetensors, WriterRejectsBadTensors) {
  const std::vector<uint8_t> four(4);
  auto kind_of = [](const std::vector<SafetensorsWriteTensor>& t) {
    try {
      (void)safetensors_bytes(t);
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;
  };
  EXPECT_EQ(kind_of({{"a", DType::kF32, {1}, four}, {"a", DType::kF32, {1}, four}}), ErrorKind::kUsage);
  EXPECT_EQ(kind_of({{"__metadata__", DType::kF32, {1}, four}}), ErrorKind::kUsage);
  EXPECT_EQ(kind_of({{"a", DType::kF32, {2}, four}}), ErrorKind::kUsage);
  EXPECT_EQ(kind_of({{"a", DType::kF32, {-1}, four}}), ErrorKind::kUsage);
  EXPECT_EQ(kind_of({{"a", DType::kQ8_0, {32}, four}}), ErrorKind::kUnsupported);
}

TEST(Safetensors, ShardedSetFromReference) {
  const json want = expected();
  for (const std::string& path : {testing::data_path("safetensors/sharded"),
                                  testing::data_path("safetensors/sharded/model.safetensors.index.json")}) {
    SCOPED_TRACE(path);
    SafetensorsSet set(path);
    EXPECT_EQ(set.files().size(), 2u);
    ASSERT_EQ(set.size(), want["tensors"].size());
    for (const json& w : want["tensors"]) {
      const SafetensorsTensor* t = set.tensor(w["name"].get<std::string>());
      ASSERT_NE(t, nullptr) << w["name"];
      EXPECT_EQ(std::vector<uint8_t>(t->data.begin(), t->data.end()), from_hex(w["data"].get<std::string>()));
    }
    EXPECT_EQ(set.names().front(), "empty");
  }
  SafetensorsSet single(testing::data_path("safetensors/python_written.safetensors"));
  EXPECT_EQ(single.size(), want["tensors"].size());
}

std::string set_error(const std::string& path, ErrorKind want) {
  try {
    SafetensorsSet set(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "opened " << path;
  return "";
}

TEST(Safetensors, ShardedSetErrors) {
  TempDir dir;
  const std::vector<uint8_t> four(4);
  write_safetensors(dir.file("a.safetensors"), {{"x", DType::kF32, {1}, four}});
  write_safetensors(dir.file("b.safetensors"), {{"y", DType::kF32, {1}, four}, {"x", DType::kF32, {1}, four}});
  auto index = [&](const std::string& text) {
    std::ofstream(dir.file("model.safetensors.index.json")) << text;
    return dir.file("model.safetensors.index.json");
  };
  EXPECT_NE(set_error(index(R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})"), ErrorKind::kFormat)
                .find("tensor 'x' is also in"),
            std::string::npos);
  EXPECT_NE(set_error(index(R"({"weight_map": {"y": "a.safetensors"}})"), ErrorKind::kFormat)
                .find("puts tensor 'y' in 'a.safetensors', which does not contain it"),
            std::string::npos);
  EXPECT_NE(set_error(index(R"({"weight_map": {"y": "c.safetensors"}})"), ErrorKind::kIo).find("shard 'c.safetensors'"),
            std::string::npos);
  EXPECT_NE(
      set_error(index(R"({"weight_map": {"y": "../b.safetensors"}})"), ErrorKind::kFormat).find("not a file name"),
      std::string::npos);
  EXPECT_NE(set_error(index(R"({"weight_map": {"y": 3}})"), ErrorKind::kFormat).find("not a file name"),
            std::string::npos);
  EXPECT_NE(set_error(index(R"({"metadata": {}})"), ErrorKind::kFormat).find("weight_map"), std::string::npos);
  EXPECT_NE(set_error(index("{"), ErrorKind::kFormat).find("not valid JSON"), std::string::npos);
  fs::remove(dir.file("model.safetensors.index.json"));
  EXPECT_NE(set_error(dir.file(""), ErrorKind::kIo).find("neither"), std::string::npos);
  EXPECT_NE(set_error(dir.file("missing.safetensors"), ErrorKind::kIo).find("missing.safetensors"), std::string::npos);
  write_safetensors(dir.file("model.safetensors"), {{"z", DType::kF32, {1}, four}});
  EXPECT_EQ(SafetensorsSet(dir.file("")).names(), std::vector<std::string>{"z"});
}

struct BadCase {
  const char* what;
  std::vector<uint8_t> bytes;
  const char* message;
  ErrorKind kind = ErrorKind::kFormat;
};

std::vector<uint8_t> with_header(const char* header, size_t data_bytes) { return file_from_header(header, data_bytes); }

TEST(Safetensors, CorruptFilesGiveOneClearError) {
  std::vector<uint8_t> huge = with_header("{}", 0);
  huge[3] = 0x10;  // header length 2^28 + 2
  std::vector<uint8_t> past_end = with_header("{}", 0);
  past_end[0] = 9;
  const std::vector<BadCase> cases = {
      {"too short", {1, 2, 3}, "too short for the 8-byte header length"},
      {"header limit", huge, "exceeds the safetensors limit"},
      {"header past end", past_end, "runs past the end of the file"},
      {"not json", with_header("{\"a\":", 0), "header is not valid JSON"},
      {"nul byte", file_from_header(std::string("{}\0", 3), 0), "NUL byte"},
      {"not object", with_header("[1, 2]", 0), "not a JSON object"},
      {"invalid utf8", with_header("{\"\xff\":{}}", 0), "not valid JSON"},
      {"entry not object", with_header(R"({"a": 3})", 0), "tensor 'a': header entry is not an object"},
      {"missing dtype", with_header(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4), "\"dtype\" is missing"},
      {"unknown dtype", with_header(R"({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}})", 4),
       "tensor 'a': unknown dtype \"Q4\""},
      {"lowercase dtype", with_header(R"({"a": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", 4),
       "unknown dtype \"f32\""},
      {"unsupported dtype", with_header(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})", 4),
       "dtype U8 is not supported", ErrorKind::kUnsupported},
      {"negative dim", with_header(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
       "shape entry -1 is not a non-negative"},
      {"float dim", with_header(R"({"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}})", 4),
       "shape entry 1.0"},
      {"dim past u64",
       with_header(R"({"a": {"dtype": "F32", "shape": [18446744073709551616], "data_offsets": [0, 4]}})", 4),
       "is not a non-negative 64-bit integer"},
      {"shape overflow",
       with_header(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8),
       "overflows 64-bit sizes"},
      {"byte overflow",
       with_header(R"({"a": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 8]}})", 8),
       "overflows 64-bit sizes"},
      {"offsets count", with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 4),
       "\"data_offsets\" is missing or not two"},
      {"offsets reversed", with_header(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", 4),
       "end before they begin"},
      {"size mismatch", with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4),
       "hold 4 bytes but F32 [2] needs 8"},
      {"past end", with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
       "tensor 'a': data_offsets [0, 8] run past the end of the data section (4 bytes)"},
      {"huge offsets",
       with_header(
           R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551612, 18446744073709551615]}})", 4),
       "hold 3 bytes but F32 [1] needs 4"},
      {"gap", with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8),
       "bytes [0, 4) of the data section before tensor 'a' belong to no tensor"},
      {"overlap",
       with_header(
           R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
           8),
       "tensor 'b': data_offsets [4, 8] overlap tensor 'a'"},
      {"trailing bytes", with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 6),
       "has 6 bytes but the tensors cover only 4"},
      {"duplicate name",
       with_header(
           R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
           8),
       "tensor 'a' appears twice"},
      {"duplicate field",
       with_header(R"({"a": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})", 4),
       "tensor 'a': duplicate key \"dtype\""},
      {"deep nesting", with_header(R"({"a": {"dtype": "F32", "shape": [[[1]]], "data_offsets": [0, 4]}})", 4),
       "nests JSON deeper"},
      {"metadata value", with_header(R"({"__metadata__": {"k": 1}})", 0),
       "\"__metadata__\" value of 'k' is not a string"},
      {"metadata type", with_header(R"({"__metadata__": [1]})", 0), "\"__metadata__\" is not an object"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string message = parse_error(c.bytes, c.kind);
    EXPECT_NE(message.find(c.message), std::string::npos) << message;
  }
}

// What the reference accepts, we accept: whitespace around the JSON, unknown entry fields, null metadata,
// zero-size tensors anywhere, scalars.
TEST(Safetensors, AcceptsWhatTheReferenceAccepts) {
  SafetensorsFile a(
      with_header(R"(  {"__metadata__": null, "z": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},)"
                  R"( "a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4], "extra": [1]}}   )",
                  4),
      "ok");
  ASSERT_EQ(a.tensors().size(), 2u);
  EXPECT_EQ(a.tensors()[0].name, "z");
  EXPECT_EQ(a.tensors()[1].name, "a");
  EXPECT_TRUE(a.metadata().empty());
  SafetensorsFile b(with_header(R"({"__metadata__": {"k": "first", "k": "last"}})", 0), "ok");
  EXPECT_EQ(b.metadata().at("k"), "last");
}

// Every truncation and every single-byte corruption of a valid file parses or throws Error; never crashes.
TEST(Safetensors, TruncationsAndByteFlipsNeverCrash) {
  const std::vector<uint8_t> good = read_bytes(testing::data_path("safetensors/python_written.safetensors"));
  for (size_t len = 0; len < good.size(); ++len) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    EXPECT_THROW(SafetensorsFile(cut, "cut"), Error) << "prefix of " << len << " bytes";
  }
  int parsed = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0x5A;
    try {
      SafetensorsFile f(bad, "flip");
      ++parsed;  // a flip inside tensor data leaves a valid file
    } catch (const Error& e) {
      EXPECT_TRUE(e.kind() == ErrorKind::kFormat || e.kind() == ErrorKind::kUnsupported) << e.what();
    }
  }
  EXPECT_GE(parsed, 100);
}

TEST(Safetensors, MissingFileIsIoError) {
  try {
    SafetensorsFile f(testing::data_path("safetensors/does_not_exist.safetensors"));
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("does_not_exist.safetensors"), std::string::npos);
  }
}

}  // namespace
}  // namespace servetune
