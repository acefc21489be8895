// The model interface the runtime drives: a forward pass over a Batch writing into a KvStorage, returning logits.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/batch.h"
#include "model/kv_storage.h"
#include "model/model_config.h"
#include "model/parallel.h"

namespace servetune {

// How the layers run (EngineConfig's compile setting): fused kernels (compile = fused), and graphs of whole decode
// steps captured per padded batch-size bucket up to graph_max_bs (compile = graphs, on backends that have graphs).
struct CompileOptions {
  bool fused = false;
  int64_t graph_max_bs = 0;
};

// Routed-expert load of a mixture-of-experts model since it was built: token-expert assignments over all MoE layers
// and steps, and per layer and step the most tokens any one expert got, summed (experts == 0: a dense model).
struct ExpertLoad {
  int64_t experts = 0;
  int64_t routed = 0;
  int64_t busiest = 0;
  // Expert parallelism: the groups of ranks owning contiguous expert ranges (1 without it), and per MoE layer and
  // step the assignments of the group with the most, summed: the rank-level imbalance EPLB's redundant experts target.
  int64_t ep_groups = 1;
  int64_t busiest_group = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const ParallelContext& parallel() const = 0;
  // KV heads this shard stores (its KV groups, or 1 replicated head when there are fewer KV heads than ranks).
  virtual int64_t local_kv_heads() const = 0;
  // Runs `batch`, storing its K/V in `kv`, and writes logits [batch.logits_indices.size(), vocab] to `logits`.
  virtual void forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits) = 0;
  // Whether forward_sampled() can run: the backend samples on the device and one rank holds the whole vocabulary.
  virtual bool device_sampling() const = 0;
  // Runs `batch` like forward() but draws each logits row's token on the device (rows[i] for row i, see
  // Backend::sample): only the ids come back, into `tokens`. Only where device_sampling().
  virtual void forward_sampled(const Batch& batch, KvStorage& kv, std::span<const SampleRow> rows, std::vector<int32_t>& tokens) = 0;
  // After a forward whose batch set return_hidden: each token's final normalised hidden state (the logits' input),
  // [n_tokens, hidden] in batch order; empty for models that do not keep them (supports_hidden() false).
  virtual std::span<const float> hidden_rows() const { return {}; }
  virtual bool supports_hidden() const { return false; }
  virtual ExpertLoad expert_load() const { return {}; }
  // Assignments per MoE layer (in layer order) and routed expert, summed over every step so far: what
  // --init-expert-location places redundant experts by. Safe to read while another thread runs forward(). Empty for a
  // model without routed experts or a rank that does not count (the engine reads rank 0's).
  virtual std::vector<std::vector<int64_t>> expert_distribution() const { return {}; }
};

}  // namespace servetune
