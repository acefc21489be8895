// make_communicator: a backend name and a CommSpec to this rank's communicator.
#include "comm/comm_common.h"
#include "comm/gloo_communicator.h"
#include "comm/local_communicator.h"
#include "core/error.h"
#ifdef SERVETUNE_WITH_NCCL
#include "comm/nccl_communicator.h"
#endif

namespace servetune {

std::vector<std::string> communicator_backends() {
#ifdef SERVETUNE_WITH_NCCL
  return {"local", "gloo", "nccl"};
#else
  return {"local", "gloo"};
#endif
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend, const CommSpec& spec) {
  if (spec.size < 1) throw_usage("communicator group size must be at least 1, got " + std::to_string(spec.size));
  if (spec.rank < 0 || spec.rank >= spec.size) {
    throw_usage("communicator rank " + std::to_string(spec.rank) + " is outside the group of " + std::to_string(spec.size));
  }
  if (spec.timeout.count() <= 0) throw_usage("communicator timeout must be positive");
  if (backend == "local") {
    if (!spec.local_group) throw_usage("the local communicator needs the LocalGroup shared by its threads");
    if (spec.local_group->size() != spec.size) {
      throw_usage("local group has " + std::to_string(spec.local_group->size()) + " ranks, the spec says " + std::to_string(spec.size));
    }
    return spec.local_group->communicator(spec.rank);
  }
  if (backend == "gloo") return make_gloo_communicator(spec);
  if (backend == "nccl") {
#ifdef SERVETUNE_WITH_NCCL
    return make_nccl_communicator(spec);
#else
    throw_unsupported("the nccl communicator is not in this build; configure with -DSERVETUNE_WITH_NCCL=ON (preset nccl)");
#endif
  }
  std::string names;
  for (const auto& n : communicator_backends()) names += (names.empty() ? "" : ", ") + n;
  throw_usage("unknown communicator backend '" + backend + "' (available: " + names + ")");
}

}  // namespace servetune
