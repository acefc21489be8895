// How big one replica's KV cache is: its element type and block count, from max_total_tokens, or from
// mem_fraction_static of RAM (CPU) or of device memory (GPU). Never more blocks than every running request can use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "servetune/engine_config.h"

namespace servetune {

class TensorParallelGroup;

// KV memory on CPU when mem_fraction_static is 0: this fraction of RAM (shared by all replicas).
constexpr double kCpuDefaultMemFraction = 0.1;
// Device memory for weights plus KV cache on a GPU when mem_fraction_static is 0 (SGLang's meaning of the setting).
constexpr double kGpuDefaultMemFraction = 0.88;

// The cache element type on `backend` (model/kv_storage.h: kv_storage_dtype).
DType kv_dtype_for(KvCacheDtype setting, const Backend& backend);

// KV bytes available under mem_fraction_static: of `physical_memory` (bytes of RAM) without a device; on a GPU,
// SGLang's meaning: the fraction of device memory for weights and KV together, less what is in use now (the weights
// are loaded already). Negative when the weights alone take more.
int64_t kv_budget_bytes(double mem_fraction_static, std::optional<DeviceMemory> device, int64_t physical_memory);

// What sizes the cache. With max_total_tokens set the budget is not consulted.
struct KvSizing {
  std::optional<int64_t> max_total_tokens;
  int64_t budget_bytes = 0;
  int64_t block_bytes = 0;  // one block of page_size tokens, over every layer of this process's ranks
  int64_t page_size = 0;
  int64_t max_running_requests = 0;
  int64_t context_length = 0;
};

// Blocks of the cache: max_total_tokens rounded up to whole pages, else as many as the budget holds, at most enough
// for max_running_requests requests at full context. Throws Error(kUsage) when the budget holds none.
int64_t kv_num_blocks(const KvSizing& sizing);

struct KvPlan {
  DType dtype = DType::kF32;
  int64_t page_size = 0;
  int64_t num_blocks = 0;
  int64_t tokens() const { return num_blocks * page_size; }
};

// The plan for `config` on the group's rank-0 backend, with the weights already loaded (a GPU budget counts them).
KvPlan plan_kv_cache(const EngineConfig& config, TensorParallelGroup& ranks, int64_t context_length);

}  // namespace servetune
