// Llama-family forward pass over a flattened varlen batch (see llama.h).
#include "model/llama.h"

#include <cmath>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"

namespace servetune {
namespace {

std::string blk(int64_t i, const char* name) { return "blk." + std::to_string(i) + "." + name; }

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config, WeightLoader& loader, Backend& backend, ParallelContext parallel)
    : config_(config), parallel_(parallel), backend_(backend),
      share_(tensor_parallel_share(config, parallel.tp_size, parallel.tp_rank)) {
  if (parallel.tp_size > 1 && parallel.comm == nullptr) {
    throw Error(ErrorKind::kInternal, "tensor parallelism needs a communicator");
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
  if (loader.has("rope_freqs.weight")) {
    const float* ff = loader.vector("rope_freqs.weight", config.rope_dim / 2);
    rope_freq_factors_.assign(ff, ff + config.rope_dim / 2);
  } else {
    rope_freq_factors_ = llama3_rope_freq_factors(config);
  }

  for (int64_t i = 0; i < config.n_layers; ++i) {
    Layer L;
    L.attn_norm = loader.vector(blk(i, "attn_norm.weight"), d);
    L.wq = loader.matrix_rows(blk(i, "attn_q.weight"), config.n_heads * hd, d, q_rows);
    L.wk = loader.matrix_rows(blk(i, "attn_k.weight"), config.n_kv_heads * hd, d, kv_rows);
    L.wv = loader.matrix_rows(blk(i, "attn_v.weight"), config.n_kv_heads * hd, d, kv_rows);
    L.wo = loader.matrix_cols(blk(i, "attn_output.weight"), d, config.n_heads * hd, q_rows);
    if (config.attention_bias || loader.has(blk(i, "attn_q.bias"))) {
      L.bq = loader.vector(blk(i, "attn_q.bias"), config.n_heads * hd, q_rows);
      L.bk = loader.vector(blk(i, "attn_k.bias"), config.n_kv_heads * hd, kv_rows);
      L.bv = loader.vector(blk(i, "attn_v.bias"), config.n_kv_heads * hd, kv_rows);
    }
    L.ffn_norm = loader.vector(blk(i, "ffn_norm.weight"), d);
    L.w_gate = loader.matrix_rows(blk(i, "ffn_gate.weight"), config.ffn, d, share_.ffn);
    L.w_up = loader.matrix_rows(blk(i, "ffn_up.weight"), config.ffn, d, share_.ffn);
    L.w_down = loader.matrix_cols(blk(i, "ffn_down.weight"), d, config.ffn, share_.ffn);
    layers_.push_back(L);
  }
  weight_buffers_ = loader.take_buffers();

  rope_.head_dim = hd;
  rope_.rope_dim = config.rope_dim;
  rope_.theta = config.rope_theta;
  rope_.freq_scale = config.rope_scaling == RopeKind::kLinear ? 1.0f / config.rope_factor : 1.0f;
  rope_.neox = config.rope_neox;
  rope_.freq_factors = rope_freq_factors_.empty() ? nullptr : rope_freq_factors_.data();
}

void LlamaModel::reserve(int64_t n_tokens, int64_t n_logits) {
  if (n_tokens > ws_.capacity) {
    const int64_t n = std::max<int64_t>(n_tokens, 16);
    auto alloc = [&](int64_t width) { return backend_.allocate(static_cast<size_t>(n * width) * sizeof(float)); };
    const int64_t ffn = share_.ffn.count;
    ws_.x = alloc(config_.hidden);
    ws_.h = alloc(config_.hidden);
    ws_.q = alloc(n_heads_ * config_.head_dim);
    ws_.k = alloc(n_kv_heads_ * config_.head_dim);
    ws_.v = alloc(n_kv_heads_ * config_.head_dim);
    ws_.attn = alloc(n_heads_ * config_.head_dim);
    ws_.gate = alloc(ffn);
    ws_.up = alloc(ffn);
    ws_.act = alloc(ffn);
    ws_.logits_in = alloc(config_.hidden);
    ws_.capacity = n;
  }
  if (n_logits > logits_capacity_) {
    logits_capacity_ = std::max<int64_t>(n_logits, 4);
    logits_out_ = backend_.allocate(static_cast<size_t>(logits_capacity_ * output_.rows) * sizeof(float));
  }
}

void LlamaModel::forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits) {
  const int64_t n = batch.n_tokens();
  const int64_t n_out = static_cast<int64_t>(batch.logits_indices.size());
  const int64_t d = config_.hidden, hd = config_.head_dim;
  const int64_t ffn = share_.ffn.count;
  if (n == 0) {
    logits.clear();
    return;
  }
  reserve(n, n_out);
  float* x = buf(ws_.x);
  float* h = buf(ws_.h);
  float* q = buf(ws_.q);
  float* k = buf(ws_.k);
  float* v = buf(ws_.v);
  float* attn = buf(ws_.attn);
  float* gate = buf(ws_.gate);
  float* up = buf(ws_.up);
  float* act = buf(ws_.act);

  AttentionBatch ab{n, batch.positions.data(), batch.seq_of_token.data(), batch.block_tables.data(), batch.max_blocks_per_seq};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  backend_.embed(tok_embd_, batch.tokens.data(), n, x);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const KvLayerView& cache = kv.layer(static_cast<int64_t>(l));
    backend_.rms_norm(x, L.attn_norm, h, n, d, config_.rms_eps);
    const Backend::MatmulOut qkv[] = {{&L.wq, L.bq, q}, {&L.wk, L.bk, k}, {&L.wv, L.bv, v}};
    backend_.matmuls(qkv, h, n);
    backend_.rope(q, batch.positions.data(), n, n_heads_, rope_);
    backend_.rope(k, batch.positions.data(), n, n_kv_heads_, rope_);
    backend_.store_kv(cache, k, v, batch.slot_mapping.data(), n);
    backend_.attention(cache, ab, q, n_heads_, scale, attn);
    backend_.matmul(L.wo, nullptr, attn, n, h);
    sum_partials(h, n * d);
    backend_.add(x, h, n * d);

    backend_.rms_norm(x, L.ffn_norm, h, n, d, config_.rms_eps);
    const Backend::MatmulOut gate_up[] = {{&L.w_gate, nullptr, gate}, {&L.w_up, nullptr, up}};
    backend_.matmuls(gate_up, h, n);
    backend_.silu_mul(gate, up, ffn, n, ffn, act);
    backend_.matmul(L.w_down, nullptr, act, n, h);
    sum_partials(h, n * d);
    backend_.add(x, h, n * d);
  }

  if (n_out == 0) {  // a prefill chunk that does not reach the end of its prompt
    logits.clear();
    return;
  }
  float* xs = buf(ws_.logits_in);
  for (int64_t i = 0; i < n_out; ++i) {
    const int32_t row = batch.logits_indices[static_cast<size_t>(i)];
    if (row < 0 || row >= n) throw Error(ErrorKind::kInternal, "logits index out of range");
    std::copy(x + row * d, x + (row + 1) * d, xs + i * d);
  }
  backend_.rms_norm(xs, output_norm_, xs, n_out, d, config_.rms_eps);
  float* out = static_cast<float*>(logits_out_->data());
  backend_.matmul(output_, nullptr, xs, n_out, out);
  if (parallel_.tp_size == 1) {
    logits.resize(static_cast<size_t>(n_out * output_.rows));
    backend_.download(logits.data(), *logits_out_, 0, logits.size() * sizeof(float));
    return;
  }
  gather_logits(out, n_out, logits);
}

void LlamaModel::sum_partials(float* partial, int64_t count) {
  if (parallel_.tp_size == 1) return;
  backend_.synchronize();
  parallel_.comm->all_reduce(partial, static_cast<size_t>(count), ReduceOp::kSum);
}

void LlamaModel::gather_logits(const float* local, int64_t n_out, std::vector<float>& logits) {
  // Rank r holds [n_out, vocab_r] for its vocabulary rows; gather them all, then interleave into [n_out, vocab].
  backend_.synchronize();
  const int tp = parallel_.tp_size;
  std::vector<size_t> counts(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) counts[static_cast<size_t>(r)] = static_cast<size_t>(n_out * balanced_slice(config_.vocab, tp, r).count);
  gathered_.resize(static_cast<size_t>(n_out * config_.vocab));
  parallel_.comm->all_gatherv(local, gathered_.data(), counts);
  logits.resize(gathered_.size());
  const float* part = gathered_.data();
  for (int r = 0; r < tp; ++r) {
    const SliceRange v = balanced_slice(config_.vocab, tp, r);
    for (int64_t i = 0; i < n_out; ++i) {
      std::copy(part + i * v.count, part + (i + 1) * v.count, logits.begin() + i * config_.vocab + v.begin);
    }
    part += n_out * v.count;
  }
}

}  // namespace servetune
