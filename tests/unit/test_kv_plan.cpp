// KV cache sizing without a model: block counts from max_total_tokens or a memory budget (capped by what the running
// requests can use), the budget from mem_fraction_static on CPU and GPU, and the cache's element type.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/kv_storage.h"
#include "runtime/kv_plan.h"
#include "servetune/model_info.h"

namespace servetune {
namespace {

KvSizing sizing(int64_t budget_bytes) {
  KvSizing s;
  s.budget_bytes = budget_bytes;
  s.block_bytes = 1000;
  s.page_size = 16;
  s.max_running_requests = 4;
  s.context_length = 100;  // 4 x 100 tokens: 25 blocks of 16 at most
  return s;
}

TEST(KvPlan, MaxTotalTokensRoundsUpToWholePagesAndIgnoresTheBudget) {
  KvSizing s = sizing(0);
  s.max_total_tokens = 33;
  EXPECT_EQ(kv_num_blocks(s), 3);
  s.max_total_tokens = 32;
  EXPECT_EQ(kv_num_blocks(s), 2);
  s.max_total_tokens = 10000;  // more than the running requests can use: given anyway
  EXPECT_EQ(kv_num_blocks(s), 625);
}

TEST(KvPlan, BudgetHoldsWholeBlocksUpToWhatTheRunningRequestsCanUse) {
  EXPECT_EQ(kv_num_blocks(sizing(7999)), 7);
  EXPECT_EQ(kv_num_blocks(sizing(8000)), 8);
  EXPECT_EQ(kv_num_blocks(sizing(1'000'000)), 25);
}

TEST(KvPlan, NoRoomForOneBlockIsAUsageError) {
  for (int64_t budget : {int64_t{999}, int64_t{0}, int64_t{-5000}}) {
    try {
      kv_num_blocks(sizing(budget));
      ADD_FAILURE() << "accepted a budget of " << budget;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_STREQ(e.what(), "mem_fraction_static leaves no memory for the KV cache");
    }
  }
}

TEST(KvPlan, CpuBudgetIsAFractionOfRam) {
  const int64_t ram = int64_t{64} << 30;
  EXPECT_EQ(kv_budget_bytes(0.25, std::nullopt, ram), int64_t{16} << 30);
  const auto default_budget = static_cast<int64_t>(kCpuDefaultMemFraction * static_cast<double>(ram));
  EXPECT_EQ(kv_budget_bytes(0.0, std::nullopt, ram), default_budget);
}

TEST(KvPlan, GpuBudgetIsTheFractionOfDeviceMemoryLessWhatIsInUse) {
  const DeviceMemory mem{100'000, 70'000};  // 30'000 in use (the weights)
  EXPECT_EQ(kv_budget_bytes(0.5, mem, 1), 20'000);
  EXPECT_EQ(kv_budget_bytes(0.0, mem, 1), 88'000 - 30'000);
  EXPECT_EQ(kv_budget_bytes(0.2, mem, 1), -10'000);  // the weights alone exceed it
}

TEST(KvPlan, CacheTypeOnTheCpu) {
  const auto cpu = make_backend("cpu", 1);
  EXPECT_EQ(kv_dtype_for(KvCacheDtype::kAuto, *cpu), DType::kF32);
  EXPECT_EQ(kv_dtype_for(KvCacheDtype::kF32, *cpu), DType::kF32);
  EXPECT_EQ(kv_dtype_for(KvCacheDtype::kF16, *cpu), DType::kF16);
  EXPECT_EQ(kv_dtype_for(KvCacheDtype::kFp8E4m3, *cpu), DType::kFP8_E4M3);
}

// The public API's element size (the tuner's memory estimate) follows the same choice, GPUs included.
TEST(KvPlan, ElementBytesAsTheEngineStoresThem) {
  EXPECT_EQ(kv_element_bytes(KvCacheDtype::kAuto, Device::kCpu), 4);
  EXPECT_EQ(kv_element_bytes(KvCacheDtype::kAuto, Device::kCuda), 2);
  EXPECT_EQ(kv_element_bytes(KvCacheDtype::kAuto, Device::kHip), 2);
  EXPECT_EQ(kv_element_bytes(KvCacheDtype::kF32, Device::kCuda), 4);
  EXPECT_EQ(kv_element_bytes(KvCacheDtype::kF16, Device::kCpu), 2);
  EXPECT_EQ(kv_element_bytes(KvCacheDtype::kFp8E4m3, Device::kCpu), 1);
  EXPECT_EQ(kv_element_bytes(KvCacheDtype::kBf16, Device::kCuda), 2);
}

// auto on a GPU is bf16 (f32's range: no f16 overflow); the cpu keeps f32 and stores bf16 when asked.
TEST(KvPlan, AutoIsBf16OnGpusAndTheCpuStoresBf16WhenAsked) {
  EXPECT_EQ(kv_storage_dtype(KvCacheDtype::kAuto, false), DType::kBF16);
  EXPECT_EQ(kv_storage_dtype(KvCacheDtype::kBf16, false), DType::kBF16);
  EXPECT_EQ(kv_storage_dtype(KvCacheDtype::kF16, false), DType::kF16);
  EXPECT_EQ(kv_storage_dtype(KvCacheDtype::kBf16, true), DType::kBF16);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), KvCacheDtype::kBf16);
  const auto cpu = make_backend("cpu", 1);
  EXPECT_EQ(kv_dtype_for(KvCacheDtype::kBf16, *cpu), DType::kBF16);
  EXPECT_TRUE(cpu->supports_kv_dtype(DType::kBF16));
  EXPECT_EQ(kv_element_bytes(KvCacheDtype::kBf16, Device::kCpu), 2);
}

}  // namespace
}  // namespace servetune

namespace servetune {
namespace {

// DeepSeek-V3's attention shape: 61 layers, 128 heads of 192 query/key and 128 value dims, MLA with a 512-value
// latent and a 64-value rotary key.
ModelConfig deepseek_v3_attention(bool latent) {
  ModelConfig c;
  c.n_layers = 61;
  c.n_heads = 128;
  c.n_kv_heads = 128;
  c.head_dim = 192;
  c.rope_dim = 64;
  if (latent) c.mla = {1536, 512, 128, 64, 128};
  return c;
}

TEST(KvPlan, LatentAttentionCachesOneLatentRowPerTokenAndLayer) {
  // Per token: 61 layers x (512 + 64) f16 values = 70,272 bytes; per-head K and V would be 61 x 128 x 2 x 192.
  EXPECT_EQ(KvStorage::block_bytes(deepseek_v3_attention(true), 1, 1, DType::kF16), 61 * 576 * 2);
  EXPECT_EQ(KvStorage::block_bytes(deepseek_v3_attention(true), 1, 16, DType::kFP8_E4M3), 16 * 61 * 576);
  EXPECT_EQ(KvStorage::block_bytes(deepseek_v3_attention(false), 128, 1, DType::kF16), 61 * 128 * 2 * 192 * 2);
  // So a 1 GiB budget holds 954 blocks of 16 tokens of latent cache in f16.
  KvSizing s;
  s.budget_bytes = int64_t{1} << 30;
  s.block_bytes = KvStorage::block_bytes(deepseek_v3_attention(true), 1, 16, DType::kF16);
  s.page_size = 16;
  s.max_running_requests = 1024;
  s.context_length = 163840;
  EXPECT_EQ(kv_num_blocks(s), (int64_t{1} << 30) / (16 * 61 * 576 * 2));
}

}  // namespace
}  // namespace servetune
