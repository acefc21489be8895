// The kinds of collective the engine's communicator runs and their totals (public API: EngineStats reports them per
// kind). all_gather covers all_gatherv and all_to_all covers all_to_allv: the variable-size forms are the same
// collective on the wire.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace servetune {

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kBarrier };
inline constexpr size_t kCollectiveKinds = 6;

// "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier": the infix of the metric keys.
constexpr const char* collective_kind_name(CollectiveKind kind) {
  constexpr const char* kNames[kCollectiveKinds] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier"};
  return kNames[static_cast<size_t>(kind)];
}

// One kind's totals: the collectives run, their payload bytes on one rank (the elements the Communicator call names
// times the element size: an all-reduce's buffer, an all-gather's gathered output, a reduce-scatter's input, an
// all-to-all's sent elements, a broadcast's buffer), and their time.
struct CollectiveTotals {
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0.0;
};

// Indexed by CollectiveKind.
using CollectiveStats = std::array<CollectiveTotals, kCollectiveKinds>;

inline CollectiveTotals& totals_of(CollectiveStats& stats, CollectiveKind kind) { return stats[static_cast<size_t>(kind)]; }
inline const CollectiveTotals& totals_of(const CollectiveStats& stats, CollectiveKind kind) { return stats[static_cast<size_t>(kind)]; }

}  // namespace servetune
