// Communication cost model of a candidate: the bytes each collective moves per engine step, from the model's shape,
// the step's tokens and the ranks, and the predicted time on named interconnects (alpha-beta, ring algorithms). Pure
// arithmetic; the engine's own scheme is checked against its measured counters (tests/integration/test_comm_volume).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "servetune/collective_kind.h"
#include "servetune/model_info.h"

namespace servetune::tuner {

// The engine's collectives carry f32 on every backend (CommDType::kF32), so every payload element takes 4 bytes.
inline constexpr int64_t kCommElementBytes = 4;

// A GPU-to-GPU (or node-to-node) link as the model sees it: bandwidth per GPU per direction and the latency of one
// message (one hop of a ring). Sources and assumptions: comm_cost.cpp and docs/sweep-file.md (interconnects).
struct Interconnect {
  std::string name;  // the sweep-file value: nvlink4, mi300x-if, 100gbe, 400gbe
  double gb_per_s = 0.0;  // 1e9 bytes per second
  double latency_us = 0.0;
};

const std::vector<Interconnect>& interconnects();
// The interconnect named `name`, or nullptr.
const Interconnect* find_interconnect(const std::string& name);

// One collective of a step, run by every rank: `calls` per step, each with `payload_bytes` on one rank (counted as the
// engine's TimedCommunicator counts them, see CollectiveTotals) of which `sent_bytes` leave the rank under the
// algorithm assumed, in `hops` latency-bound messages.
struct StepCollective {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::string what;
  int64_t calls = 0;
  int64_t payload_bytes = 0;
  double sent_bytes = 0.0;
  int64_t hops = 0;
};

// The tokens of one step over all ranks, and how many of them return logits rows.
struct StepShape {
  int64_t tokens = 0;
  int64_t logits_rows = 0;
};

// How the ranks share the work (SGLang's schemes; the engine runs all but kExpertAllToAll).
enum class CommScheme {
  kTensorParallel,   // TP attention and FFN; EP over the same all-reduce (moe_tp x ep = tp)
  kExpertAllToAll,   // not implemented: TP attention, EP with all-to-all dispatch and combine (SGLang's DeepEP mode)
  kDpAttention,      // DP attention (tp = dp replicas): all-gather before and reduce-scatter after each MoE layer
  kDpAttentionAllToAll,  // DP attention, each MoE layer's tokens dispatched all-to-all (--moe-a2a-backend deepep)
};
const char* comm_scheme_label(CommScheme scheme);

// The collectives of one step of `scheme` on `ranks` ranks (tp_size) with `ep` expert-parallel groups; empty on one
// rank. Throws Error(kUsage) for ranks < 1, or ep < 1 or not dividing ranks.
std::vector<StepCollective> step_collectives(CommScheme scheme, const ModelInfo& model, int ranks, int ep, const StepShape& step);

// Per kind: calls and payload bytes of one step (seconds stay 0), comparable with EngineStats::collectives.
CollectiveStats predicted_stats(const std::vector<StepCollective>& collectives);
// Bytes one rank sends in one step.
double sent_bytes_per_step(const std::vector<StepCollective>& collectives);
// Predicted time of one step's collectives: per call, hops x latency + sent bytes / bandwidth.
double predicted_seconds(const std::vector<StepCollective>& collectives, const Interconnect& link);

// One line for `servetune sweep --dry-run`, e.g. "comm per decode step (64 tokens): TP all-reduce 1.2 MiB/rank ->
// 3 us nvlink4, 25 us 400gbe; ...": every scheme the model and layout allow (EP all-to-all on a MoE model with
// ep > 1, DP attention with and without all-to-all dispatch on a MoE model), the unimplemented ones marked. Empty
// for one rank.
std::string comm_cost_line(const std::string& step_name, const ModelInfo& model, int ranks, int ep, const StepShape& step,
                           const std::vector<const Interconnect*>& links);

}  // namespace servetune::tuner
