// KV cache sizing (see kv_plan.h): the arithmetic is pure; only plan_kv_cache reads the machine's memory.
#include "runtime/kv_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/host_memory.h"
#include "model/kv_storage.h"
#include "runtime/tensor_parallel_group.h"

namespace servetune {
namespace {

int64_t physical_memory_bytes() {
  const int64_t bytes = physical_host_memory();
  return bytes > 0 ? bytes : int64_t{8} << 30;
}

}  // namespace

DType kv_dtype_for(KvCacheDtype setting, const Backend& backend) { return kv_storage_dtype(setting, backend.host_memory()); }

int64_t kv_budget_bytes(double mem_fraction_static, std::optional<DeviceMemory> device, int64_t physical_memory) {
  if (device) {
    const double fraction = mem_fraction_static > 0 ? mem_fraction_static : kGpuDefaultMemFraction;
    return static_cast<int64_t>(fraction * static_cast<double>(device->total)) - (device->total - device->free);
  }
  const double fraction = mem_fraction_static > 0 ? mem_fraction_static : kCpuDefaultMemFraction;
  return static_cast<int64_t>(fraction * static_cast<double>(physical_memory));
}

int64_t kv_num_blocks(const KvSizing& s) {
  const int64_t page = s.page_size;
  if (s.max_total_tokens) return (*s.max_total_tokens + page - 1) / page;
  // No point in more KV than every running request at full context.
  const int64_t useful = (s.max_running_requests * s.context_length + page - 1) / page;
  const int64_t num_blocks = std::min(s.budget_bytes / s.block_bytes, useful);
  if (num_blocks <= 0) throw_usage("mem_fraction_static leaves no memory for the KV cache");
  return num_blocks;
}

KvPlan plan_kv_cache(const EngineConfig& config, TensorParallelGroup& ranks, int64_t context_length) {
  KvPlan plan;
  const Backend& backend = ranks.backend(0);
  plan.dtype = kv_dtype_for(config.kv_cache_dtype, backend);
  plan.page_size = config.page_size;
  KvSizing sizing;
  sizing.max_total_tokens = config.max_total_tokens;
  sizing.block_bytes = ranks.kv_block_bytes(plan.page_size, plan.dtype);
  sizing.page_size = plan.page_size;
  sizing.max_running_requests = config.max_running_requests;
  sizing.context_length = context_length;
  if (!config.max_total_tokens) {
    sizing.budget_bytes = kv_budget_bytes(config.mem_fraction_static, backend.device_memory(), physical_memory_bytes());
  }
  plan.num_blocks = kv_num_blocks(sizing);
  return plan;
}

}  // namespace servetune
