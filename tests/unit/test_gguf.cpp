// GGUF reader: the real stories260K file, synthetic files of every value type, and corrupt files.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "gguf_builder.h"
#include "test_paths.h"

namespace servetune {
namespace {

using testing::GgufBuilder;

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    GgufFile f(bytes, "bad.gguf");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    return e.what();
  }
  return "";
}

TEST(Gguf, ReadsStories260K) {
  GgufFile f(testing::stories_path());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 5);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_NEAR(*f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_TRUE(tokens->is_array());
  EXPECT_EQ(tokens->elem_type(), GgufType::kString);
  EXPECT_EQ(tokens->size(), 512u);
  EXPECT_EQ(tokens->strings()[1], "<s>");
  EXPECT_EQ(f.tensors().size(), 48u);
  const GgufTensorInfo* emb = f.tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(emb->dtype, DType::kF32);
  EXPECT_EQ(emb->n_bytes, 64 * 512 * 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(emb->data) % 32, 0u);
}

TEST(Gguf, EveryValueType) {
  GgufBuilder b(2);
  b.kv_u32("u32", 7);
  b.kv_i32("i32", -7);
  b.kv_f32("f32", 1.5f);
  b.kv_bool("b", true);
  b.kv_str("s", "hello");
  b.kv_u64("u64", 1ull << 40);
  b.kv_f64("f64", 0.25);
  b.kv_str_array("sa", {"a", "", "ccc"});
  b.kv_f32_array("fa", {1.0f, 2.0f});
  auto bytes = b.build();
  GgufFile f(bytes, "mem.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_int("u32"), 7);
  EXPECT_EQ(f.get_int("i32"), -7);
  EXPECT_EQ(f.get_float("f32"), 1.5);
  EXPECT_EQ(f.get_bool("b"), true);
  EXPECT_EQ(f.get_string("s"), "hello");
  EXPECT_EQ(f.get_int("u64"), int64_t{1} << 40);
  EXPECT_EQ(f.get_float("f64"), 0.25);
  EXPECT_EQ(f.find("sa")->strings(), (std::vector<std::string_view>{"a", "", "ccc"}));
  EXPECT_EQ(f.find("fa")->at(1).as_float(), 2.0);
  EXPECT_FALSE(f.get_int("missing").has_value());
  EXPECT_THROW(f.get_int("s"), Error);
}

TEST(Gguf, TensorData) {
  GgufBuilder b;
  std::vector<uint8_t> data(4 * 6);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  b.tensor("w", {3, 2}, 0, data);
  b.tensor("q", {32}, 8, std::vector<uint8_t>(34, 1));  // one Q8_0 block
  auto bytes = b.build();
  GgufFile f(bytes, "mem.gguf");
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensor("w")->n_elements(), 6);
  EXPECT_EQ(f.tensor("w")->data[5], 5);
  EXPECT_EQ(f.tensor("q")->dtype, DType::kQ8_0);
  EXPECT_EQ(f.tensor("q")->n_bytes, 34);
}

TEST(Gguf, RejectsBadMagicAndVersion) {
  EXPECT_NE(parse_error({'G', 'G'}).find("too short"), std::string::npos);
  EXPECT_NE(parse_error({'G', 'G', 'M', 'L', 0, 0, 0, 0}).find("bad magic"), std::string::npos);
  auto v1 = GgufBuilder(1).build();
  EXPECT_NE(parse_error(v1).find("version 1"), std::string::npos);
  auto v9 = GgufBuilder(9).build();
  EXPECT_NE(parse_error(v9).find("unsupported GGUF version 9"), std::string::npos);
}

TEST(Gguf, RejectsTruncation) {
  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.tensor("w", {8}, 0, std::vector<uint8_t>(32, 0));
  auto bytes = b.build();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    std::string err = parse_error(prefix);
    EXPECT_FALSE(err.empty()) << "truncation at " << cut << " was accepted";
    EXPECT_NE(err.find("bad.gguf"), std::string::npos) << err;
  }
}

TEST(Gguf, RejectsHostileSizes) {
  {  // huge metadata count
    GgufBuilder b;
    auto bytes = b.build();
    uint64_t huge = 1ull << 60;
    std::memcpy(bytes.data() + 16, &huge, 8);
    EXPECT_NE(parse_error(bytes).find("metadata count"), std::string::npos);
  }
  {  // huge string length
    GgufBuilder b;
    b.kv_str("k", "v");
    auto bytes = b.build();
    uint64_t huge = ~0ull;
    std::memcpy(bytes.data() + 24, &huge, 8);
    EXPECT_NE(parse_error(bytes).find("past the end"), std::string::npos);
  }
  {  // dimensions whose product overflows
    GgufBuilder b;
    b.tensor("w", {1ull << 40, 1ull << 40}, 0, {});
    EXPECT_NE(parse_error(b.build()).find("absurd dimension"), std::string::npos);
  }
  {  // data past the end
    GgufBuilder b;
    b.tensor("w", {1024}, 0, std::vector<uint8_t>(16, 0));
    EXPECT_NE(parse_error(b.build()).find("runs past the end"), std::string::npos);
  }
  {  // unknown tensor type names what is supported
    GgufBuilder b;
    b.tensor("w", {256}, 16, std::vector<uint8_t>(66, 0));
    std::string err = parse_error(b.build());
    EXPECT_NE(err.find("IQ2_XXS"), std::string::npos) << err;
    EXPECT_NE(err.find("supported"), std::string::npos) << err;
  }
  {  // row not a multiple of the block size
    GgufBuilder b;
    b.tensor("w", {33}, 8, std::vector<uint8_t>(68, 0));
    EXPECT_NE(parse_error(b.build()).find("block size"), std::string::npos);
  }
  {  // duplicate keys
    GgufBuilder b;
    b.kv_u32("k", 1);
    b.kv_u32("k", 2);
    EXPECT_NE(parse_error(b.build()).find("duplicate metadata key"), std::string::npos);
  }
  {  // bad alignment
    GgufBuilder b;
    b.kv_u32("general.alignment", 3);
    EXPECT_NE(parse_error(b.build()).find("power of two"), std::string::npos);
  }
}

TEST(Gguf, MissingFileNamesPath) {
  try {
    GgufFile f("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

}  // namespace
}  // namespace servetune
