// Element type table and GGML type-id mapping (ids from ggml.h's enum ggml_type).
#include "core/dtype.h"

#include <array>
#include <cctype>

namespace servetune {
namespace {

constexpr int kQK = 32;     // elements per legacy quant block
constexpr int kQK_K = 256;  // elements per k-quant super-block

// Indexed by DType's underlying value.
constexpr std::array<DTypeInfo, 21> kInfos = {{
    {"F32", 1, 4, false},
    {"F16", 1, 2, false},
    {"BF16", 1, 2, false},
    {"F64", 1, 8, false},
    {"I8", 1, 1, false},
    {"I16", 1, 2, false},
    {"I32", 1, 4, false},
    {"I64", 1, 8, false},
    {"Q4_0", kQK, 2 + kQK / 2, true},
    {"Q4_1", kQK, 4 + kQK / 2, true},
    {"Q5_0", kQK, 2 + 4 + kQK / 2, true},
    {"Q5_1", kQK, 4 + 4 + kQK / 2, true},
    {"Q8_0", kQK, 2 + kQK, true},
    {"Q2_K", kQK_K, kQK_K / 16 + kQK_K / 4 + 4, true},
    {"Q3_K", kQK_K, kQK_K / 8 + kQK_K / 4 + 12 + 2, true},
    {"Q4_K", kQK_K, 4 + 12 + kQK_K / 2, true},
    {"Q5_K", kQK_K, 4 + 12 + kQK_K / 8 + kQK_K / 2, true},
    {"Q6_K", kQK_K, kQK_K / 2 + kQK_K / 4 + kQK_K / 16 + 2, true},
    {"Q8_K", kQK_K, 4 + kQK_K + kQK_K / 8, true},
    {"FP8_E4M3", 1, 1, false},
    {"FP8_E4M3_B128", 1, 1, false},
}};

struct GgmlId {
  uint32_t id;
  DType type;
  std::string_view name;
};

constexpr std::array<GgmlId, 19> kGgml = {{
    {0, DType::kF32, "F32"},    {1, DType::kF16, "F16"},    {2, DType::kQ4_0, "Q4_0"},  {3, DType::kQ4_1, "Q4_1"},
    {6, DType::kQ5_0, "Q5_0"},  {7, DType::kQ5_1, "Q5_1"},  {8, DType::kQ8_0, "Q8_0"},  {10, DType::kQ2_K, "Q2_K"},
    {11, DType::kQ3_K, "Q3_K"}, {12, DType::kQ4_K, "Q4_K"}, {13, DType::kQ5_K, "Q5_K"}, {14, DType::kQ6_K, "Q6_K"},
    {15, DType::kQ8_K, "Q8_K"}, {24, DType::kI8, "I8"},     {25, DType::kI16, "I16"},   {26, DType::kI32, "I32"},
    {27, DType::kI64, "I64"},   {28, DType::kF64, "F64"},   {30, DType::kBF16, "BF16"},
}};

// GGML ids servetune recognises by name but cannot load, so errors can say what the file holds.
struct GgmlName {
  uint32_t id;
  std::string_view name;
};
constexpr std::array<GgmlName, 14> kGgmlOtherNames = {{
    {9, "Q8_1"},     {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"},  {20, "IQ4_NL"}, {21, "IQ3_S"},
    {22, "IQ2_S"},   {23, "IQ4_XS"},  {29, "IQ1_M"},  {34, "TQ1_0"},   {35, "TQ2_0"},  {39, "MXFP4"},  {40, "NVFP4"},
}};

}  // namespace

const DTypeInfo& dtype_info(DType t) { return kInfos[static_cast<size_t>(t)]; }

std::optional<int64_t> dtype_row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  if (n < 0 || n % info.block_size != 0) return std::nullopt;
  int64_t blocks = n / info.block_size;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(blocks, info.type_size, &bytes)) return std::nullopt;
  return bytes;
}

std::optional<DType> dtype_from_ggml(uint32_t ggml_type) {
  for (const GgmlId& g : kGgml) {
    if (g.id == ggml_type) return g.type;
  }
  return std::nullopt;
}

std::string ggml_type_name(uint32_t ggml_type) {
  for (const GgmlId& g : kGgml) {
    if (g.id == ggml_type) return std::string(g.name);
  }
  for (const GgmlName& g : kGgmlOtherNames) {
    if (g.id == ggml_type) return std::string(g.name);
  }
  return "unknown(" + std::to_string(ggml_type) + ")";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string upper;
  for (char c : name) upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  if (upper == "FP8" || upper == "FP8_E4M3" || upper == "E4M3") return DType::kFP8_E4M3;
  for (size_t i = 0; i < kInfos.size(); ++i) {
    if (kInfos[i].name == upper) return static_cast<DType>(i);
  }
  return std::nullopt;
}

}  // namespace servetune
