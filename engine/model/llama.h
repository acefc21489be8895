// The llama architecture family (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2 with q/k/v biases): token embedding,
// RMSNorm, rotary embeddings, grouped-query attention over the paged KV cache, SwiGLU MLP, tied or separate head.
// Under tensor parallelism one instance is one rank's shard (see parallel.h): its partial attention-output and down
// projections are all-reduced, and its vocabulary rows' logits all-gathered, over the ParallelContext's communicator.
#pragma once

#include <memory>
#include <vector>

#include "model/batch_indices.h"
#include "model/decode_graphs.h"
#include "model/model.h"
#include "model/rotary.h"
#include "model/weight_loader.h"

namespace servetune {

class LlamaModel final : public Model {
 public:
  // Loads this rank's shard of every weight through `loader`. compile.fused: one stacked QKV and one gate/up matmul
  // per layer, rotary fused with the KV store, residual adds fused into the next RMSNorm. compile.graph_max_bs: decode
  // steps of up to that many sequences run as graphs captured per padded batch-size bucket (backends with graphs).
  LlamaModel(const ModelConfig& config, WeightLoader& loader, Backend& backend, ParallelContext parallel,
             CompileOptions compile = {});

  const ModelConfig& config() const override { return config_; }
  const ParallelContext& parallel() const override { return parallel_; }
  int64_t local_kv_heads() const override { return n_kv_heads_; }
  void forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits) override;
  bool device_sampling() const override { return parallel_.tp_size == 1 && backend_.device_sampling(); }
  void forward_sampled(const Batch& batch, KvStorage& kv, std::span<const SampleRow> rows, std::vector<int32_t>& tokens) override;
  std::span<const float> hidden_rows() const override { return hidden_; }
  bool supports_hidden() const override { return true; }

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    WeightMatrix wq, wk, wv, wo;
    const float* bq = nullptr;
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* ffn_norm = nullptr;
    WeightMatrix w_gate, w_up, w_down;
    WeightMatrix wqkv, w_gate_up;  // fused: [q | k | v] and [gate | up] rows stacked
    const float* bqkv = nullptr;
  };

  // Activation buffers sized for `n_tokens` tokens (grown on demand), and the batch's index arrays in backend memory.
  struct Workspace {
    int64_t capacity = 0;
    std::unique_ptr<Buffer> x, h, q, k, v, attn, gate, up, act, logits_in;  // fused: k holds qkv rows, gate gate|up
    std::unique_ptr<Buffer> indices;
    std::vector<int32_t> packed;  // host staging of `indices`
  };

  // Grows the workspace; true when it moved (captured graphs point at the old buffers).
  bool reserve(int64_t n_tokens, int64_t n_logits);
  BatchIndices place_indices(const Batch& batch);
  float* buf(std::unique_ptr<Buffer>& b) { return static_cast<float*>(b->data()); }
  // Embedding, layers, and the output head for `n_out` rows (logits left in logits_out_): no host work, so a graph
  // can capture it.
  void compute(int64_t n, int64_t n_out, int64_t max_blocks_per_seq, const BatchIndices& ix, KvStorage& kv);
  void forward_layers(int64_t n, int64_t max_blocks_per_seq, const BatchIndices& ix, KvStorage& kv);
  // Runs `batch` (through a graph when it qualifies), leaving its logits rows in logits_out_ (rank-local vocabulary).
  void run_batch(const Batch& batch, KvStorage& kv);
  // Decode batches of up to compile.graph_max_bs sequences through graphs_; false when `batch` does not qualify.
  bool forward_graph(const Batch& batch, KvStorage& kv);

  ModelConfig config_;
  ParallelContext parallel_;
  Backend& backend_;
  bool fused_;
  DecodeGraphs graphs_;  // compile = graphs
  TensorParallelShare share_;
  int64_t n_heads_;     // local query heads
  int64_t n_kv_heads_;  // local KV heads
  WeightMatrix tok_embd_;
  const float* output_norm_ = nullptr;
  WeightMatrix output_;
  std::vector<Layer> layers_;
  ModelRotary rotary_;
  std::vector<std::unique_ptr<Buffer>> weight_buffers_;
  Workspace ws_;
  std::unique_ptr<Buffer> logits_out_;
  int64_t logits_capacity_ = 0;
  std::vector<float> gathered_;  // all ranks' logits before interleaving (tp_size > 1)
  std::vector<float> hidden_;    // hidden_rows(): the last return_hidden batch's final normalised states
};

}  // namespace servetune
