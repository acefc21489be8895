// The llama architecture family (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2 with q/k/v biases): token embedding,
// RMSNorm, rotary embeddings, grouped-query attention over the paged KV cache, SwiGLU MLP, tied or separate head.
// Under tensor parallelism one instance is one rank's shard (see parallel.h): its partial attention-output and down
// projections are all-reduced, and its vocabulary rows' logits all-gathered, over the ParallelContext's communicator.
#pragma once

#include <memory>
#include <vector>

#include "model/model.h"
#include "model/weight_loader.h"

namespace servetune {

class LlamaModel final : public Model {
 public:
  // Loads this rank's shard of every weight through `loader`.
  LlamaModel(const ModelConfig& config, WeightLoader& loader, Backend& backend, ParallelContext parallel);

  const ModelConfig& config() const override { return config_; }
  const ParallelContext& parallel() const override { return parallel_; }
  int64_t local_kv_heads() const override { return n_kv_heads_; }
  void forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits) override;

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    WeightMatrix wq, wk, wv, wo;
    const float* bq = nullptr;
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* ffn_norm = nullptr;
    WeightMatrix w_gate, w_up, w_down;
  };

  // Activation buffers sized for `n_tokens` tokens (grown on demand).
  struct Workspace {
    int64_t capacity = 0;
    std::unique_ptr<Buffer> x, h, q, k, v, attn, gate, up, act, logits_in;
  };

  void reserve(int64_t n_tokens, int64_t n_logits);
  // Row-parallel layers: sums every rank's partial output in place (all-reduce; a no-op without tensor parallelism).
  void sum_partials(float* partial, int64_t count);
  // Vocab-parallel head: gathers every rank's logits columns into full [n_out, vocab] rows.
  void gather_logits(const float* local, int64_t n_out, std::vector<float>& logits);
  float* buf(std::unique_ptr<Buffer>& b) { return static_cast<float*>(b->data()); }

  ModelConfig config_;
  ParallelContext parallel_;
  Backend& backend_;
  TensorParallelShare share_;
  int64_t n_heads_;     // local query heads
  int64_t n_kv_heads_;  // local KV heads
  WeightMatrix tok_embd_;
  const float* output_norm_ = nullptr;
  WeightMatrix output_;
  std::vector<Layer> layers_;
  std::vector<float> rope_freq_factors_;
  RopeParams rope_;
  std::vector<std::unique_ptr<Buffer>> weight_buffers_;
  Workspace ws_;
  std::unique_ptr<Buffer> logits_out_;
  int64_t logits_capacity_ = 0;
  std::vector<float> gathered_;  // all ranks' logits before interleaving (tp_size > 1)
};

}  // namespace servetune
