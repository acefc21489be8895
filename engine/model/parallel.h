// Where a model shard sits in a tensor-parallel group, and which part of each sharded dimension it owns.
// Attention is split by whole KV groups (a KV head and the query heads that read it), as evenly as they go; with
// fewer KV heads than ranks, each KV head is replicated on tp_size / n_kv_heads ranks that split its query heads.
// Latent attention (MLA) splits its query heads as evenly as they go; every rank caches the whole latent row.
// Routed experts follow SGLang's layout: ep_size groups of moe_tp = tp_size / ep_size ranks; group g owns the
// contiguous experts [g * E / ep, (g + 1) * E / ep), each expert's intermediate dimension split moe_tp ways.
#pragma once

#include <cstdint>
#include <string>

namespace servetune {

class Communicator;
struct ModelConfig;

// A contiguous [begin, begin + count) range of one dimension.
struct SliceRange {
  int64_t begin = 0;
  int64_t count = 0;
};

// How the routed experts split (EngineConfig's ep_size, ep_num_redundant_experts, init_expert_location).
struct ExpertSplit {
  ExpertSplit(int ep = 1) : ep_size(ep) {}  // NOLINT(google-explicit-constructor): ep_size alone is the common case
  int ep_size = 1;
  int redundant_experts = 0;
  std::string expert_location = "trivial";
};

struct ParallelContext {
  int tp_rank = 0;
  int tp_size = 1;
  Communicator* comm = nullptr;  // the tensor-parallel group; required when tp_size > 1, not owned
  int ep_size = 1;               // expert-parallel groups among the MoE layers' ranks (divides their number)
  // DP attention (SGLang's --enable-dp-attention with dp = tp): this rank is one data-parallel attention replica
  // (tp_size 1: attention, dense MLPs and the head whole here, its own requests and KV cache), and the MoE layers
  // span every replica: their tokens are gathered over `moe_comm` before routing and the summed outputs scattered
  // back. Null otherwise (the MoE layers span the tensor-parallel group). Not owned.
  Communicator* moe_comm = nullptr;
  // DP attention only: each replica routes its own tokens and sends each one, all-to-all, only to the ranks owning
  // any of its experts, which send their weighted sums back (DeepEP's dispatch and combine); the shared experts are
  // then whole on every rank, for its own tokens. False: every replica's tokens are gathered to every rank.
  bool moe_all_to_all = false;
  // Expert parallelism's redundant experts (SGLang's --ep-num-redundant-experts): the MoE layers have n_experts +
  // redundant_experts slots split over the ep_size groups, placed by `expert_location` ("trivial" or a file;
  // model/expert_placement.h).
  int redundant_experts = 0;
  std::string expert_location = "trivial";

  bool dp_attention() const { return moe_comm != nullptr; }

  // The routed experts' split as one value, and this context with another one.
  ExpertSplit experts() const {
    ExpertSplit s(ep_size);
    s.redundant_experts = redundant_experts;
    s.expert_location = expert_location;
    return s;
  }
  ParallelContext with_experts(const ExpertSplit& s) const {
    ParallelContext p = *this;
    p.ep_size = s.ep_size;
    p.redundant_experts = s.redundant_experts;
    p.expert_location = s.expert_location;
    return p;
  }
};

// One rank's share of a model's sharded dimensions.
struct TensorParallelShare {
  SliceRange q_heads;   // query heads (rows of wq / cols of wo, in head_dim units)
  SliceRange kv_heads;  // KV heads stored and projected by this rank (replicated ones included)
  SliceRange ffn;       // gate/up rows, down cols
  SliceRange vocab;     // output-head rows (logits columns this rank computes)
};

// One rank's share of a mixture-of-experts model's FFNs.
struct ExpertShare {
  SliceRange experts;     // expert slots this rank computes (its expert-parallel group's range)
  SliceRange expert_ffn;  // of each of them, this rank's part of the intermediate dimension (moe_tp ways)
  SliceRange shared_ffn;  // the shared experts' intermediate dimension (tp_size ways, as the dense MLP)
};

// Splits `n` into `parts` contiguous ranges whose sizes differ by at most one; returns part `index`.
SliceRange balanced_slice(int64_t n, int parts, int index);

// The share of `rank` in a group of `tp_size`. Throws Error(kUsage) naming the numbers when the heads cannot be
// split (n_kv_heads neither >= tp_size nor a divisor of it, or a replicated KV head's query heads not dividing
// evenly) or the feed-forward dimension does not divide by tp_size.
TensorParallelShare tensor_parallel_share(const ModelConfig& config, int tp_size, int rank);

// The expert share of `rank` with `ep_size` expert-parallel groups; `experts` is a range of expert slots (the routed
// experts, then `redundant` extra slots). Throws Error(kUsage) naming the numbers when ep_size > 1 on a model without
// routed experts, ep_size does not divide tp_size, the slots do not divide by ep_size, redundant slots come without
// ep_size > 1, or an intermediate dimension does not divide by its ranks (moe_tp for the routed ones, tp_size shared).
ExpertShare expert_parallel_share(const ModelConfig& config, int tp_size, int ep_size, int rank, int redundant = 0);

}  // namespace servetune
