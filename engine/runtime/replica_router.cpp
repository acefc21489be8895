// Replica choice for data parallelism (see replica_router.h).
#include "runtime/replica_router.h"

#include "core/error.h"

namespace servetune {

size_t ReplicaRouter::choose(const std::vector<ReplicaLoad>& loads) {
  if (method_ == LoadBalanceMethod::kRoundRobin) return next_++ % loads.size();
  size_t best = 0;
  for (size_t i = 1; i < loads.size(); ++i) {
    const auto& a = loads[i];
    const auto& b = loads[best];
    if (a.live_requests < b.live_requests || (a.live_requests == b.live_requests && a.free_kv_blocks > b.free_kv_blocks)) best = i;
  }
  return best;
}

}  // namespace servetune
