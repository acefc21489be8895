// Element-type table: GGML ids, block geometry, row sizes, names.
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/half.h"

namespace servetune {
namespace {

TEST(DType, GgmlIdsAndSizes) {
  EXPECT_EQ(dtype_from_ggml(3), DType::kQ4_1);
  EXPECT_EQ(dtype_from_ggml(30), DType::kBF16);
  EXPECT_FALSE(dtype_from_ggml(16).has_value());
  EXPECT_EQ(ggml_type_name(16), "IQ2_XXS");
  EXPECT_EQ(ggml_type_name(999), "unknown(999)");
  EXPECT_EQ(dtype_row_bytes(DType::kQ4_1, 64), 40);
  EXPECT_EQ(dtype_row_bytes(DType::kQ8_0, 32), 34);
  EXPECT_EQ(dtype_row_bytes(DType::kQ6_K, 256), 210);
  EXPECT_EQ(dtype_row_bytes(DType::kQ4_K, 256), 144);
  EXPECT_EQ(dtype_row_bytes(DType::kQ5_K, 256), 176);
  EXPECT_EQ(dtype_row_bytes(DType::kQ3_K, 256), 110);
  EXPECT_EQ(dtype_row_bytes(DType::kQ2_K, 256), 84);
  EXPECT_FALSE(dtype_row_bytes(DType::kQ4_0, 31).has_value());
  EXPECT_EQ(dtype_from_name("bf16"), DType::kBF16);
  EXPECT_EQ(dtype_from_name("fp8"), DType::kFP8_E4M3);
  EXPECT_FALSE(dtype_from_name("q9").has_value());
  EXPECT_EQ(dtype_name(DType::kFP8_E4M3_B128), "FP8_E4M3_B128");
  EXPECT_EQ(dtype_row_bytes(DType::kFP8_E4M3_B128, 260), 260);  // one byte a code; the scales live beside the rows
}

// A row slice of a block-scaled matrix that starts inside a block finds its scales through the row offset.
TEST(DType, BlockScalesOfASlice) {
  const float grid[] = {1, 2, 3, 4, 5, 6};  // 3 block rows of 2 (a matrix of up to 384 rows, 256 columns)
  const BlockScales whole{grid, 2, 0};
  EXPECT_EQ(whole.at(0, 0), 1.0f);
  EXPECT_EQ(whole.at(127, 255), 2.0f);
  EXPECT_EQ(whole.at(128, 128), 4.0f);
  EXPECT_EQ(whole.block_rows(300), 3);
  const BlockScales from_row_100{grid, 2, 100};  // rows [100, 300)
  EXPECT_EQ(from_row_100.at(27, 0), 1.0f);
  EXPECT_EQ(from_row_100.at(28, 0), 3.0f);
  EXPECT_EQ(from_row_100.at(199, 200), 6.0f);
  EXPECT_EQ(from_row_100.block_rows(200), 3);
  EXPECT_EQ(from_row_100.block_rows(28), 1);
}

TEST(Half, RoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = fp16_to_f32(static_cast<uint16_t>(h));
    if (f != f) continue;  // NaN payloads need not round-trip
    EXPECT_EQ(f32_to_fp16(f), h) << h;
  }
  EXPECT_EQ(fp16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3F80);  // tie rounds to even
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3F82);
}

}  // namespace
}  // namespace servetune
