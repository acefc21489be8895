// Chooses the data-parallel replica of a new request, as SGLang's --load-balance-method: round_robin cycles
// through the replicas; shortest_queue takes the one with the fewest live requests (running + waiting, counted at
// submission, so a burst spreads before any step runs), breaking ties by the most free KV blocks, then by index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "servetune/engine_setting_enums.h"  // LoadBalanceMethod

namespace servetune {

struct ReplicaLoad {
  int64_t live_requests = 0;
  int64_t free_kv_blocks = 0;
};

class ReplicaRouter {
 public:
  explicit ReplicaRouter(LoadBalanceMethod method) : method_(method) {}
  // Index into `loads` (one entry per replica, at least one). Not thread-safe: the caller serialises.
  size_t choose(const std::vector<ReplicaLoad>& loads);

 private:
  LoadBalanceMethod method_;
  size_t next_ = 0;
};

}  // namespace servetune
