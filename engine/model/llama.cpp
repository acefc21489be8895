// Llama-family forward pass over a flattened varlen batch (see llama.h).
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "model/shard_collectives.h"

namespace servetune {
LlamaModel::LlamaModel(const ModelConfig& config, WeightLoader& loader, Backend& backend, ParallelContext parallel,
                       CompileOptions compile)
    : config_(config), parallel_(parallel), backend_(backend), fused_(compile.fused), graphs_(backend, compile.graph_max_bs),
      share_(tensor_parallel_share(config, parallel.tp_size, parallel.tp_rank)) {
  if (parallel.tp_size > 1 && parallel.comm == nullptr) {
    throw Error(ErrorKind::kInternal, "tensor parallelism needs a communicator");
  }
  expert_parallel_share(config, parallel.tp_size, parallel.ep_size, parallel.tp_rank, parallel.redundant_experts);  // refused here
  if (parallel.dp_attention()) {
    throw_usage("DP attention (enable_dp_attention) spreads the mixture-of-experts layers over the data-parallel "
                "replicas; this " + config.architecture + " model has none (use dp_size alone)");
  }
  n_heads_ = share_.q_heads.count;
  n_kv_heads_ = share_.kv_heads.count;
  const int64_t d = config.hidden, hd = config.head_dim;
  const SliceRange q_rows{share_.q_heads.begin * hd, share_.q_heads.count * hd};
  const SliceRange kv_rows{share_.kv_heads.begin * hd, share_.kv_heads.count * hd};

  // Every rank holds the whole embedding table (a lookup costs no matmul, and needs no all-reduce); the output head
  // is vocab-parallel: each rank computes the logits of its vocabulary rows, gathered after the matmul.
  tok_embd_ = loader.matrix("token_embd.weight", config.vocab, d);
  output_norm_ = loader.vector("output_norm.weight", d);
  output_ = loader.matrix_rows(config.tied_embeddings ? "token_embd.weight" : "output.weight", config.vocab, d, share_.vocab);
  rotary_ = ModelRotary(config, loader, backend_);

  for (int64_t i = 0; i < config.n_layers; ++i) {
    Layer L;
    L.attn_norm = loader.vector(blk(i, "attn_norm.weight"), d);
    const bool bias = config.attention_bias || loader.has(blk(i, "attn_q.bias"));
    // compile = fused stacks the projections whose weights share a storage type (a layer that cannot keeps them apart).
    if (fused_ && loader.stackable({blk(i, "attn_q.weight"), blk(i, "attn_k.weight"), blk(i, "attn_v.weight")})) {
      L.wqkv = loader.stacked_rows({{blk(i, "attn_q.weight"), config.n_heads * hd, d, q_rows},
                                    {blk(i, "attn_k.weight"), config.n_kv_heads * hd, d, kv_rows},
                                    {blk(i, "attn_v.weight"), config.n_kv_heads * hd, d, kv_rows}});
      if (bias) {
        L.bqkv = loader.stacked_vectors({{blk(i, "attn_q.bias"), config.n_heads * hd, q_rows},
                                         {blk(i, "attn_k.bias"), config.n_kv_heads * hd, kv_rows},
                                         {blk(i, "attn_v.bias"), config.n_kv_heads * hd, kv_rows}});
      }
    } else {
      L.wq = loader.matrix_rows(blk(i, "attn_q.weight"), config.n_heads * hd, d, q_rows);
      L.wk = loader.matrix_rows(blk(i, "attn_k.weight"), config.n_kv_heads * hd, d, kv_rows);
      L.wv = loader.matrix_rows(blk(i, "attn_v.weight"), config.n_kv_heads * hd, d, kv_rows);
      if (bias) {
        L.bq = loader.vector(blk(i, "attn_q.bias"), config.n_heads * hd, q_rows);
        L.bk = loader.vector(blk(i, "attn_k.bias"), config.n_kv_heads * hd, kv_rows);
        L.bv = loader.vector(blk(i, "attn_v.bias"), config.n_kv_heads * hd, kv_rows);
      }
    }
    L.wo = loader.matrix_cols(blk(i, "attn_output.weight"), d, config.n_heads * hd, q_rows);
    L.ffn_norm = loader.vector(blk(i, "ffn_norm.weight"), d);
    if (fused_ && loader.stackable({blk(i, "ffn_gate.weight"), blk(i, "ffn_up.weight")})) {
      L.w_gate_up = loader.stacked_rows({{blk(i, "ffn_gate.weight"), config.ffn, d, share_.ffn},
                                         {blk(i, "ffn_up.weight"), config.ffn, d, share_.ffn}});
    } else {
      L.w_gate = loader.matrix_rows(blk(i, "ffn_gate.weight"), config.ffn, d, share_.ffn);
      L.w_up = loader.matrix_rows(blk(i, "ffn_up.weight"), config.ffn, d, share_.ffn);
    }
    L.w_down = loader.matrix_cols(blk(i, "ffn_down.weight"), d, config.ffn, share_.ffn);
    layers_.push_back(L);
  }
  weight_buffers_ = loader.take_buffers();

}

BatchIndices LlamaModel::place_indices(const Batch& batch) {
  if (batch.has_tree() && !backend_.supports_tree_attention()) {
    throw_unsupported("draft-tree verification (speculative_eagle_topk > 1) needs tree attention, which the " +
                      backend_.name() + " backend does not have");
  }
  return place_batch_indices(backend_, batch, ws_.packed, [&](const std::vector<int32_t>& packed) {
    const size_t bytes = packed.size() * sizeof(int32_t);
    if (!ws_.indices || ws_.indices->size() < bytes) ws_.indices = backend_.allocate(std::max<size_t>(2 * bytes, 4096));
    backend_.upload(*ws_.indices, 0, packed.data(), bytes);
    return static_cast<const int32_t*>(ws_.indices->data());
  });
}

bool LlamaModel::reserve(int64_t n_tokens, int64_t n_logits) {
  const bool grows = n_tokens > ws_.capacity || n_logits > logits_capacity_;
  if (grows) graphs_.drop();  // they point at the buffers about to be replaced
  if (n_tokens > ws_.capacity) {
    const int64_t n = std::max<int64_t>(n_tokens, 16);
    auto alloc = [&](int64_t width) { return backend_.allocate(static_cast<size_t>(n * width) * sizeof(float)); };
    const int64_t ffn = share_.ffn.count;
    ws_.x = alloc(config_.hidden);
    ws_.h = alloc(config_.hidden);
    ws_.q = alloc(n_heads_ * config_.head_dim);
    ws_.k = alloc(fused_ ? (n_heads_ + 2 * n_kv_heads_) * config_.head_dim : n_kv_heads_ * config_.head_dim);
    ws_.v = alloc(n_kv_heads_ * config_.head_dim);
    ws_.attn = alloc(n_heads_ * config_.head_dim);
    ws_.gate = alloc(fused_ ? 2 * ffn : ffn);
    ws_.up = alloc(ffn);
    ws_.act = alloc(ffn);
    ws_.logits_in = alloc(config_.hidden);
    ws_.capacity = n;
  }
  if (n_logits > logits_capacity_) {
    logits_capacity_ = std::max<int64_t>(n_logits, 4);
    logits_out_ = backend_.allocate(static_cast<size_t>(logits_capacity_ * output_.rows) * sizeof(float));
  }
  return grows;
}

void LlamaModel::run_batch(const Batch& batch, KvStorage& kv) {
  const int64_t n = batch.n_tokens();
  const int64_t n_out = static_cast<int64_t>(batch.logits_indices.size());
  for (const int32_t row : batch.logits_indices) {
    if (row < 0 || row >= n) throw Error(ErrorKind::kInternal, "logits index out of range");
  }
  hidden_.clear();
  if (!batch.return_hidden && !batch.has_tree() && forward_graph(batch, kv)) return;
  reserve(n, n_out);
  compute(n, n_out, batch.max_blocks_per_seq, place_indices(batch), kv);
  if (!batch.return_hidden) return;
  // Every token's final normalised hidden state (the logits' input), for a draft head.
  const int64_t d = config_.hidden;
  float* normed = buf(ws_.h);  // free once the layers are done
  backend_.rms_norm(buf(ws_.x), output_norm_, normed, n, d, config_.rms_eps);
  hidden_.resize(static_cast<size_t>(n * d));
  backend_.download(hidden_.data(), *ws_.h, 0, hidden_.size() * sizeof(float));
}

void LlamaModel::forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits) {
  const auto n_out = static_cast<int64_t>(batch.logits_indices.size());
  if (batch.n_tokens() == 0) {
    logits.clear();
    return;
  }
  run_batch(batch, kv);
  if (n_out == 0) {  // a prefill chunk that does not reach the end of its prompt
    logits.clear();
    return;
  }
  if (parallel_.tp_size == 1) {
    logits.resize(static_cast<size_t>(n_out * output_.rows));
    backend_.download(logits.data(), *logits_out_, 0, logits.size() * sizeof(float));
    return;
  }
  gather_vocab_logits(backend_, parallel_, config_.vocab, static_cast<const float*>(logits_out_->data()), n_out, gathered_, logits);
}

void LlamaModel::forward_sampled(const Batch& batch, KvStorage& kv, std::span<const SampleRow> rows,
                                 std::vector<int32_t>& tokens) {
  if (!device_sampling()) throw Error(ErrorKind::kInternal, "forward_sampled needs a device-sampling backend and tp_size 1");
  const auto n_out = static_cast<int64_t>(batch.logits_indices.size());
  if (static_cast<int64_t>(rows.size()) != n_out) throw Error(ErrorKind::kInternal, "forward_sampled: one SampleRow per logits row");
  tokens.resize(static_cast<size_t>(n_out));
  if (batch.n_tokens() == 0) return;
  run_batch(batch, kv);
  if (n_out > 0) backend_.sample(static_cast<const float*>(logits_out_->data()), n_out, output_.rows, rows, tokens.data());
}

void LlamaModel::compute(int64_t n, int64_t n_out, int64_t max_blocks_per_seq, const BatchIndices& ix, KvStorage& kv) {
  const int64_t d = config_.hidden;
  float* x = buf(ws_.x);
  backend_.embed(tok_embd_, ix.tokens, n, x);
  forward_layers(n, max_blocks_per_seq, ix, kv);
  if (n_out == 0) return;
  // Gathers the rows whose logits are returned: an embedding lookup in the f32 table of hidden states.
  float* xs = buf(ws_.logits_in);
  const WeightMatrix hidden{x, DType::kF32, n, d, d * static_cast<int64_t>(sizeof(float))};
  backend_.embed(hidden, ix.logits_rows, n_out, xs);
  backend_.rms_norm(xs, output_norm_, xs, n_out, d, config_.rms_eps);
  backend_.matmul(output_, nullptr, xs, n_out, static_cast<float*>(logits_out_->data()));
}

bool LlamaModel::forward_graph(const Batch& batch, KvStorage& kv) {
  if (parallel_.tp_size != 1 || !graphs_.takes(batch)) return false;
  reserve(graphs_.max_bs(), graphs_.max_bs());
  const DecodeGraphs::Step step = graphs_.prepare(batch, kv);
  graphs_.run(step, [&] { compute(step.bucket, step.bucket, step.width, step.ix, kv); });
  return true;  // rows [0, n) of logits_out_ are the real sequences
}

// With fused_ (compile = fused) the same arithmetic in fewer launches: stacked QKV and gate/up matmuls, rotary fused
// with the KV store, and each residual add fused into the RMSNorm that follows it (the last one stays a plain add).
void LlamaModel::forward_layers(int64_t n, int64_t max_blocks_per_seq, const BatchIndices& ix, KvStorage& kv) {
  const int64_t d = config_.hidden, ffn = share_.ffn.count;
  float* x = buf(ws_.x);
  float* h = buf(ws_.h);
  float* q = buf(ws_.q);
  float* k = buf(ws_.k);  // fused: the stacked [q | k | v] rows
  float* v = buf(ws_.v);
  float* attn = buf(ws_.attn);
  float* gate = buf(ws_.gate);  // fused: the stacked [gate | up] rows
  float* act = buf(ws_.act);
  const AttentionBatch ab{n, ix.positions, ix.seq_of_token, ix.block_tables, max_blocks_per_seq, ix.tree_base, ix.tree_mask};
  const float scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const KvLayerView& cache = kv.layer(static_cast<int64_t>(l));
    if (!fused_ || l == 0) backend_.rms_norm(x, L.attn_norm, h, n, d, config_.rms_eps);
    else backend_.add_rms_norm(x, h, L.attn_norm, h, n, d, config_.rms_eps);  // h: the previous layer's MLP output
    if (L.wqkv.data != nullptr) {
      backend_.matmul(L.wqkv, L.bqkv, h, n, k);
      backend_.rope_store_qkv(cache, k, ix.positions, ix.slots, n, n_heads_, rotary_.params(), q);
    } else {
      const Backend::MatmulOut qkv[] = {{&L.wq, L.bq, q}, {&L.wk, L.bk, k}, {&L.wv, L.bv, v}};
      backend_.matmuls(qkv, h, n);
      backend_.rope(q, ix.positions, n, n_heads_, rotary_.params());
      backend_.rope(k, ix.positions, n, n_kv_heads_, rotary_.params());
      backend_.store_kv(cache, k, v, ix.slots, n);
    }
    backend_.attention(cache, ab, q, n_heads_, scale, attn);
    if (l + 1 < layers_.size()) backend_.prefetch_attention(kv.layer(static_cast<int64_t>(l + 1)), ab);
    backend_.matmul(L.wo, nullptr, attn, n, h);
    sum_partials(backend_, parallel_, h, n * d);
    if (fused_) {
      backend_.add_rms_norm(x, h, L.ffn_norm, h, n, d, config_.rms_eps);
    } else {
      backend_.add(x, h, n * d);
      backend_.rms_norm(x, L.ffn_norm, h, n, d, config_.rms_eps);
    }
    const bool gate_up = L.w_gate_up.data != nullptr;
    float* up = gate_up ? gate + ffn : buf(ws_.up);
    if (gate_up) {
      backend_.matmul(L.w_gate_up, nullptr, h, n, gate);
    } else {
      const Backend::MatmulOut gate_and_up[] = {{&L.w_gate, nullptr, gate}, {&L.w_up, nullptr, up}};
      backend_.matmuls(gate_and_up, h, n);
    }
    if (fused_) {
      backend_.silu_mul_matmul(L.w_down, gate, up, gate_up ? 2 * ffn : ffn, n, act, h);
    } else {
      backend_.silu_mul(gate, up, gate_up ? 2 * ffn : ffn, n, ffn, act);
      backend_.matmul(L.w_down, nullptr, act, n, h);
    }
    sum_partials(backend_, parallel_, h, n * d);
    if (!fused_) backend_.add(x, h, n * d);
  }
  if (fused_) backend_.add(x, h, n * d);
}

}  // namespace servetune
