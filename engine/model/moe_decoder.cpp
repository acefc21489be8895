// Mixture-of-experts decoder forward pass: attention (grouped-query or latent), then a dense or routed FFN (see
// moe_decoder.h).
#include "model/moe_decoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/quant.h"
#include "comm/communicator.h"
#include "model/shard_collectives.h"

namespace servetune {
namespace {

// Activation buffers by role.
enum Slot : size_t {
  kX, kH, kOut, kQ, kK, kV, kAttn, kQA, kLatent, kRopeKey, kQAbsorbed, kAttnLatent, kRouter,
  kGathered, kExpertOut, kSharedOut, kSharedGate, kLogitsIn, kLogits, kReplicaTokens, kReplicaSums,
  kDispatch, kDispatched, kCombine, kCombined, kSharedSum, kDraftLogits, kIndices, kOrderRows, kOrderWeights,
  kSharedRows, kSharedWeights, kHidden, kSlotCount
};

}  // namespace

MoeDecoderModel::MoeDecoderModel(const ModelConfig& config, WeightLoader& loader, Backend& backend,
                                 ParallelContext parallel, CompileOptions compile)
    : MoeDecoderModel(config, loader, backend, parallel, compile, -1, false, {}) {}

std::unique_ptr<MoeDecoderModel> MoeDecoderModel::next_n(const ModelConfig& target, int64_t nextn, WeightLoader& loader,
                                                         Backend& backend, std::span<const int32_t> draft_vocab) {
  if (nextn < 0 || nextn >= target.nextn_layers) {
    throw_usage("the model has " + std::to_string(target.nextn_layers) + " multi-token-prediction (next-n) layers "
                "(num_nextn_predict_layers); layer " + std::to_string(nextn) + " was asked for");
  }
  const int64_t block = target.n_layers + nextn;
  ModelConfig c = target;
  c.n_layers = 1;
  c.nextn_layers = 0;
  // MoE or dense by the family's rule for its block index, which the checkpoint shows by the router's presence.
  if (c.is_moe()) c.moe.moe_layer = {loader.has(blk(block, "ffn_gate_inp.weight"))};
  return std::unique_ptr<MoeDecoderModel>(new MoeDecoderModel(c, loader, backend, ParallelContext{}, CompileOptions{}, block, false, draft_vocab));
}

std::unique_ptr<MoeDecoderModel> MoeDecoderModel::eagle_head(const ModelConfig& head, WeightLoader& loader, Backend& backend,
                                                             std::span<const int32_t> draft_vocab) {
  if (head.n_layers != 1 || head.is_moe() || head.is_mla()) {
    throw_unsupported("EAGLE heads with one dense decoder layer are supported; this one has " + std::to_string(head.n_layers) +
                      " layers" + (head.is_moe() || head.is_mla() ? " and mixture-of-experts or latent attention" : ""));
  }
  return std::unique_ptr<MoeDecoderModel>(new MoeDecoderModel(head, loader, backend, ParallelContext{}, CompileOptions{}, -1, true, draft_vocab));
}

MoeDecoderModel::MoeDecoderModel(const ModelConfig& config, WeightLoader& loader, Backend& backend,
                                 ParallelContext parallel, CompileOptions compile, int64_t nextn_block, bool eagle,
                                 std::span<const int32_t> draft_vocab)
    : nextn_block_(nextn_block), eagle_(eagle), draft_vocab_(draft_vocab.begin(), draft_vocab.end()), config_(config),
      parallel_(parallel), backend_(backend), fused_(compile.fused),
      share_(tensor_parallel_share(config, parallel.tp_size, parallel.tp_rank)),
      expert_share_(parallel.dp_attention()
                        ? expert_parallel_share(config, parallel.moe_comm->size(), parallel.ep_size, parallel.moe_comm->rank(),
                                                parallel.redundant_experts)
                        : expert_parallel_share(config, parallel.tp_size, parallel.ep_size, parallel.tp_rank,
                                                parallel.redundant_experts)),
      n_heads_(share_.q_heads.count), graphs_(backend, compile.graph_max_bs), moe_comm_(parallel.moe_comm) {
  const std::string family = config.architecture;
  if (parallel.tp_size > 1 && parallel.comm == nullptr) {
    throw Error(ErrorKind::kInternal, "tensor parallelism needs a communicator");
  }
  if (parallel.dp_attention() && parallel.tp_size > 1) {
    throw_unsupported("DP attention with tensor parallelism inside each replica (dp_size < tp_size) is not implemented "
                      "yet; use dp_size = tp_size");
  }
  if (parallel.dp_attention() && !config.is_moe()) {
    throw_usage("DP attention (enable_dp_attention) spreads the mixture-of-experts layers over the data-parallel "
                "replicas; this " + family + " model has no routed experts (use dp_size alone)");
  }
  if (parallel.moe_all_to_all) {
    if (!parallel.dp_attention()) throw Error(ErrorKind::kInternal, "all-to-all dispatch needs the DP-attention replicas");
    // Each replica runs the shared experts of its own tokens: whole on every rank.
    expert_share_.shared_ffn = {0, config.is_moe() ? config.moe.shared_ffn : 0};
    for (int r = 0; r < parallel.moe_comm->size(); ++r) {
      rank_experts_.push_back(
          expert_parallel_share(config, parallel.moe_comm->size(), parallel.ep_size, r, parallel.redundant_experts).experts);
    }
  }
  if (!backend.host_memory()) {
    if (parallel.dp_attention()) {
      throw_unsupported(family + ": DP attention (enable_dp_attention) runs on the cpu backend only for now (its "
                        "expert dispatch exchanges host memory); the " + backend.name() + " backend runs dp_size 1");
    }
    host_backend_ = make_backend("cpu", 1);
    host_loader_ = std::make_unique<WeightLoader>(loader.source(), *host_backend_, parallel);
  }
  const int64_t d = config.hidden;
  rotary_ = ModelRotary(config, loader, backend_);
  if (eagle_) {
    load_eagle_inputs(loader);
  } else if (nextn_block_ >= 0) {
    load_next_n_inputs(loader, nextn_block_);
  } else {
    tok_embd_ = loader.matrix("token_embd.weight", config.vocab, d);
    output_norm_ = loader.vector("output_norm.weight", d);
    // As LlamaModel: the whole embedding table on every rank, the output head vocab-parallel (gathered after it).
    output_ = loader.matrix_rows(config.tied_embeddings ? "token_embd.weight" : "output.weight", config.vocab, d, share_.vocab);
  }
  load_.experts = config.is_moe() ? config.moe.routing.n_experts : 0;
  load_.ep_groups = parallel.ep_size;
  place_experts();
  // A GPU routes, groups and runs the experts without the host (no placement or DP attention to apply there).
  device_routing_ = config.is_moe() && !backend.host_memory() && moe_comm_ == nullptr && parallel.tp_size == 1 &&
                    placements_.empty() && backend.routes_on_device(config.moe.routing);
  // Graphs replay a step's ops without the host, so every MoE layer must stay on the device.
  if (compile.graph_max_bs > 0 && config.is_moe() && !device_routing_) {
    throw_unsupported(family + ": compile = graphs needs the experts routed on the device, which the " + backend.name() +
                      " backend does not do here (the cuda build does, without SERVETUNE_GPU_MOE=loop or "
                      "SERVETUNE_GPU_GEMM=tiled, for one GPU without expert placement); use compile = fused");
  }
  if (compile.graph_max_bs > 0 && config.is_moe() && config.moe.shared_gate) {
    throw_unsupported(family + ": compile = graphs is not implemented for a gated shared expert (qwen2_moe: its gate "
                               "is applied on the host); use compile = fused");
  }
  for (int64_t l = 0; l < config.n_layers; ++l) {
    Layer L;
    if (config.is_moe() && config.moe.moe_layer[static_cast<size_t>(l)]) {
      L.moe_index = static_cast<int64_t>(std::count(config.moe.moe_layer.begin(), config.moe.moe_layer.begin() + l, true));
      if (!placements_.empty()) L.placement = &placements_[static_cast<size_t>(L.moe_index)];
    }
    const int64_t block = nextn_block_ >= 0 ? nextn_block_ : l;  // the layer's index in the checkpoint's names
    // EAGLE heads drop their first layer's input norm (EAGLE-2's checkpoints have none).
    const bool optional_norm = eagle_ && !loader.has(blk(block, "attn_norm.weight"));
    L.attn_norm = optional_norm ? nullptr : loader.vector(blk(block, "attn_norm.weight"), d);
    load_attention(L, block, loader);
    L.ffn_norm = loader.vector(blk(block, "ffn_norm.weight"), d);
    load_ffn(L, block, loader);
    layers_.push_back(std::move(L));
  }
  weight_buffers_ = loader.take_buffers();
  host_loader_.reset();  // what it placed was copied out during the load
  host_backend_.reset();

  scratch_.resize(kSlotCount);
  scratch_floats_.assign(kSlotCount, 0);
}

// The next-n layer's own tensors (llama.cpp's blk.N.nextn.* names); its embedding and head fall back to the
// target's, which DeepSeek's checkpoints copy into the layer anyway.
void MoeDecoderModel::load_next_n_inputs(WeightLoader& loader, int64_t block) {
  const int64_t d = config_.hidden, vocab = config_.vocab;
  const std::string embed = blk(block, "nextn.embed_tokens.weight");
  const std::string head = blk(block, "nextn.shared_head_head.weight");
  tok_embd_ = loader.matrix(loader.has(embed) ? embed : "token_embd.weight", vocab, d);
  output_norm_ = loader.vector(blk(block, "nextn.shared_head_norm.weight"), d);
  const std::string target_head = config_.tied_embeddings ? "token_embd.weight" : "output.weight";
  load_head_output(loader, loader.has(head) ? head : target_head);
  enorm_ = loader.vector(blk(block, "nextn.enorm.weight"), d);
  hnorm_ = loader.vector(blk(block, "nextn.hnorm.weight"), d);
  const std::string eh = blk(block, "nextn.eh_proj.weight");
  eh_embed_ = loader.matrix_cols(eh, d, 2 * d, {0, d});
  eh_hidden_ = loader.matrix_cols(eh, d, 2 * d, {d, d});
}

void MoeDecoderModel::load_eagle_inputs(WeightLoader& loader) {
  const int64_t d = config_.hidden, vocab = config_.vocab;
  tok_embd_ = loader.matrix("token_embd.weight", vocab, d);
  load_head_output(loader, loader.has("output.weight") ? "output.weight" : "token_embd.weight");
  eh_embed_ = loader.matrix_cols("eagle_fc.weight", d, 2 * d, {0, d});
  eh_hidden_ = loader.matrix_cols("eagle_fc.weight", d, 2 * d, {d, d});
  if (loader.has("eagle_fc.bias")) fc_bias_ = loader.vector("eagle_fc.bias", d);
}

void MoeDecoderModel::load_head_output(WeightLoader& loader, const std::string& name) {
  if (draft_vocab_.empty()) {
    output_ = loader.matrix(name, config_.vocab, config_.hidden);
    return;
  }
  if (!backend_.host_memory()) {
    throw_unsupported("a draft head's draft vocabulary (speculative_token_map) runs on the cpu backend only for now (the " +
                      backend_.name() + " backend would need the draft logits scattered on the device)");
  }
  output_ = loader.matrix_row_subset(name, config_.vocab, config_.hidden, draft_vocab_);
}

void MoeDecoderModel::scatter_draft_logits(int64_t n_out) {
  const auto hot = static_cast<int64_t>(draft_vocab_.size());
  const float* scored = scratch(kDraftLogits, n_out * hot);
  float* logits = scratch(kLogits, n_out * config_.vocab);
  std::fill(logits, logits + n_out * config_.vocab, -std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < n_out; ++r) {
    for (int64_t j = 0; j < hot; ++j) logits[r * config_.vocab + draft_vocab_[static_cast<size_t>(j)]] = scored[r * hot + j];
  }
}

void MoeDecoderModel::embed_head_input(const Batch& batch, const int32_t* tokens, float* x) {
  const int64_t n = batch.n_tokens(), d = config_.hidden;
  if (static_cast<int64_t>(batch.input_hidden.size()) != n * d) {
    throw Error(ErrorKind::kInternal, "a draft head's batch needs one input hidden state per token");
  }
  const float eps = config_.rms_eps;
  float* e = scratch(kH, n * d);
  float* h = scratch(kOut, n * d);
  float* part = scratch(kAttn, n * d);
  backend_.embed(tok_embd_, tokens, n, e);
  if (enorm_ != nullptr) backend_.rms_norm(e, enorm_, e, n, d, eps);
  backend_.upload(*scratch_[kOut], 0, batch.input_hidden.data(), batch.input_hidden.size() * sizeof(float));
  if (hnorm_ != nullptr) backend_.rms_norm(h, hnorm_, h, n, d, eps);
  backend_.matmul(eh_embed_, fc_bias_, e, n, x);
  backend_.matmul(eh_hidden_, nullptr, h, n, part);
  backend_.add(x, part, n * d);
}

// Expert slots and their placement per MoE layer; none kept while every slot holds its own expert (no translation).
void MoeDecoderModel::place_experts() {
  if (!config_.is_moe()) return;
  const int64_t E = config_.moe.routing.n_experts;
  slots_ = E + parallel_.redundant_experts;
  moe_layers_ = std::count(config_.moe.moe_layer.begin(), config_.moe.moe_layer.end(), true);
  distribution_ = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(moe_layers_ * E));
  if (parallel_.expert_location != "trivial") {
    placements_ = read_expert_location(parallel_.expert_location, moe_layers_, E, slots_, parallel_.ep_size);
  } else if (slots_ > E) {
    placements_.assign(static_cast<size_t>(moe_layers_), trivial_placement(E, slots_));
  }
}

std::vector<std::vector<int64_t>> MoeDecoderModel::expert_distribution() const {
  std::vector<std::vector<int64_t>> out;
  const int64_t E = config_.is_moe() ? config_.moe.routing.n_experts : 0;
  for (int64_t l = 0; l < moe_layers_; ++l) {
    std::vector<int64_t> row(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) row[static_cast<size_t>(e)] = distribution_[static_cast<size_t>(l * E + e)].load(std::memory_order_relaxed);
    out.push_back(std::move(row));
  }
  return out;
}

void MoeDecoderModel::load_attention(Layer& L, int64_t l, WeightLoader& loader) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden, hd = c.head_dim, h = c.n_heads;
  const SliceRange heads = share_.q_heads;  // this rank's query heads
  if (!c.is_mla()) {
    const int64_t q = h * hd, kv = c.n_kv_heads * hd;
    const SliceRange q_rows{heads.begin * hd, heads.count * hd};
    const SliceRange kv_rows{share_.kv_heads.begin * hd, share_.kv_heads.count * hd};
    L.wq = loader.matrix_rows(blk(l, "attn_q.weight"), q, d, q_rows);
    L.wk = loader.matrix_rows(blk(l, "attn_k.weight"), kv, d, kv_rows);
    L.wv = loader.matrix_rows(blk(l, "attn_v.weight"), kv, d, kv_rows);
    if (c.attention_bias) {
      L.bq = loader.vector(blk(l, "attn_q.bias"), q, q_rows);
      L.bk = loader.vector(blk(l, "attn_k.bias"), kv, kv_rows);
      L.bv = loader.vector(blk(l, "attn_v.bias"), kv, kv_rows);
    }
    if (c.qk_norm) {  // one [head_dim] weight shared by every head: whole on every rank
      L.q_norm = loader.vector(blk(l, "attn_q_norm.weight"), hd);
      L.k_norm = loader.vector(blk(l, "attn_k_norm.weight"), hd);
    }
    L.wo = loader.matrix_cols(blk(l, "attn_output.weight"), d, q, q_rows);
    return;
  }
  const MlaConfig& m = c.mla;
  if (m.q_lora_rank > 0) {
    L.wq_a = loader.matrix(blk(l, "attn_q_a.weight"), m.q_lora_rank, d);
    L.q_a_norm = loader.vector(blk(l, "attn_q_a_norm.weight"), m.q_lora_rank);
    L.wq_b = loader.matrix_rows(blk(l, "attn_q_b.weight"), h * hd, m.q_lora_rank, {heads.begin * hd, heads.count * hd});
  } else {
    L.wq = loader.matrix_rows(blk(l, "attn_q.weight"), h * hd, d, {heads.begin * hd, heads.count * hd});
  }
  // kv_a_proj_with_mqa's rows are [latent | rotary key]: two matrices, so each lands in its own contiguous rows.
  const std::string kv_a = blk(l, "attn_kv_a_mqa.weight");
  L.w_latent = loader.matrix_rows(kv_a, m.kv_lora_rank + m.qk_rope_dim, d, {0, m.kv_lora_rank});
  L.w_rope_key = loader.matrix_rows(kv_a, m.kv_lora_rank + m.qk_rope_dim, d, {m.kv_lora_rank, m.qk_rope_dim});
  L.latent_norm = loader.vector(blk(l, "attn_kv_a_norm.weight"), m.kv_lora_rank);
  L.wo = loader.matrix_cols(blk(l, "attn_output.weight"), d, h * m.v_head_dim, {heads.begin * m.v_head_dim, heads.count * m.v_head_dim});

  // kv_b_proj holds per head [key (qk_nope_dim rows) | value (v_head_dim rows)] of kv_lora_rank columns. Decoding
  // absorbs the key part into the query (q_nope . W_UK = (W_UK^T q_nope) . latent) and applies the value part after
  // attention, so the cache keeps only the latent. Both are kept as f32 copies laid out per head, of this rank's heads.
  const int64_t per_head = m.qk_nope_dim + m.v_head_dim, rank = m.kv_lora_rank;
  const auto place = [&](const std::vector<float>& values, int64_t rows, int64_t cols) {
    owned_.push_back(backend_.allocate(values.size() * sizeof(float)));
    backend_.upload(*owned_.back(), 0, values.data(), values.size() * sizeof(float));
    return WeightMatrix{owned_.back()->data(), DType::kF32, rows, cols, cols * static_cast<int64_t>(sizeof(float))};
  };
  const auto to_f32 = [](const WeightMatrix& w) {
    std::vector<float> values(static_cast<size_t>(w.rows * w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_bytes, values.data() + r * w.cols, w.cols);
    }
    return values;
  };
  WeightLoader& host = host_loader_ ? *host_loader_ : loader;  // kv_b is read on the host
  // llama.cpp's converter splits kv_b already: attn_k_b [heads, kv_lora_rank, qk_nope] (the key part transposed per
  // head, W_UK^T) and attn_v_b [heads, v_head_dim, kv_lora_rank], exactly the two layouts kept here.
  if (const std::string k_b = blk(l, "attn_k_b.weight"); host.has(k_b)) {
    L.w_uk_t = place(to_f32(host.stacked_matrices(k_b, h, rank, m.qk_nope_dim, heads)), heads.count * rank, m.qk_nope_dim);
    L.w_uv = place(to_f32(host.stacked_matrices(blk(l, "attn_v_b.weight"), h, m.v_head_dim, rank, heads)),
                   heads.count * m.v_head_dim, rank);
    return;
  }
  const WeightMatrix kv_b = host.matrix_rows(blk(l, "attn_kv_b.weight"), h * per_head, rank,
                                               {heads.begin * per_head, heads.count * per_head});
  const int64_t local = heads.count;
  std::vector<float> row(static_cast<size_t>(rank));
  std::vector<float> uk_t(static_cast<size_t>(local * rank * m.qk_nope_dim)), uv(static_cast<size_t>(local * m.v_head_dim * rank));
  for (int64_t head = 0; head < local; ++head) {
    for (int64_t r = 0; r < per_head; ++r) {
      const int64_t src_row = head * per_head + r;
      const uint8_t* stored = static_cast<const uint8_t*>(kv_b.data) + src_row * kv_b.row_bytes;
      if (kv_b.type == DType::kFP8_E4M3_B128) dequantize_fp8_block_row(stored, kv_b.scales.row(src_row), row.data(), rank);
      else dequantize_row(kv_b.type, stored, row.data(), rank);
      if (r < m.qk_nope_dim) {
        for (int64_t k = 0; k < rank; ++k) uk_t[static_cast<size_t>((head * rank + k) * m.qk_nope_dim + r)] = row[static_cast<size_t>(k)];
      } else {
        std::copy(row.begin(), row.end(), uv.begin() + (head * m.v_head_dim + r - m.qk_nope_dim) * rank);
      }
    }
  }
  L.w_uk_t = place(uk_t, local * rank, m.qk_nope_dim);
  L.w_uv = place(uv, local * m.v_head_dim, rank);
}

MoeDecoderModel::Mlp MoeDecoderModel::load_mlp(WeightLoader& loader, const std::string& gate, const std::string& up,
                                               const std::string& down, int64_t width, SliceRange ffn) {
  const int64_t d = config_.hidden;
  return {loader.matrix_rows(gate, width, d, ffn), loader.matrix_rows(up, width, d, ffn), loader.matrix_cols(down, d, width, ffn)};
}

void MoeDecoderModel::load_ffn(Layer& L, int64_t l, WeightLoader& loader) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden;
  L.moe = L.moe_index >= 0;
  if (!L.moe) {
    L.dense = load_mlp(loader, blk(l, "ffn_gate.weight"), blk(l, "ffn_up.weight"), blk(l, "ffn_down.weight"), c.ffn, share_.ffn);
    return;
  }
  const MoeConfig& m = c.moe;
  const int64_t e_ffn = m.expert_ffn, E = m.routing.n_experts;
  L.router = loader.matrix(blk(l, "ffn_gate_inp.weight"), E, d);
  if (m.selection_bias && host_loader_ && !device_routing_) {  // routing reads it on the host
    const float* bias = host_loader_->vector(blk(l, "exp_probs_b.bias"), E);
    L.host_selection_bias.assign(bias, bias + E);
  } else if (m.selection_bias) {
    L.selection_bias = loader.vector(blk(l, "exp_probs_b.bias"), E);
  }
  // Experts as one [experts, rows, cols] tensor per kind (llama.cpp's *_exps) or one tensor per expert (HF, older
  // GGUF). A layer with any stacked tensor must have all three, so a missing one is named as such. Only this rank's
  // experts are read, each its part of the intermediate dimension.
  const bool stacked = loader.has(blk(l, "ffn_gate_exps.weight")) || loader.has(blk(l, "ffn_up_exps.weight")) ||
                       loader.has(blk(l, "ffn_down_exps.weight"));
  const SliceRange part = expert_share_.expert_ffn;
  const SliceRange mine = expert_share_.experts;  // slots: each loads the expert its placement gives it
  for (int64_t slot = mine.begin; slot < mine.begin + mine.count; ++slot) {
    const int64_t e = L.placement ? L.placement->slot_expert[static_cast<size_t>(slot)] : slot;
    if (stacked) {
      const SliceRange all{0, d};
      L.experts.push_back({loader.stacked_matrix_part(blk(l, "ffn_gate_exps.weight"), E, e_ffn, d, e, part, all),
                           loader.stacked_matrix_part(blk(l, "ffn_up_exps.weight"), E, e_ffn, d, e, part, all),
                           loader.stacked_matrix_part(blk(l, "ffn_down_exps.weight"), E, d, e_ffn, e, all, part)});
    } else {
      const std::string id = "." + std::to_string(e) + ".weight";
      L.experts.push_back(load_mlp(loader, blk(l, "ffn_gate" + id), blk(l, "ffn_up" + id), blk(l, "ffn_down" + id), e_ffn, part));
    }
  }
  for (const Mlp& w : L.experts) L.expert_weights.push_back({&w.gate, &w.up, &w.down});  // L.experts is complete
  if (m.shared_ffn > 0) {
    L.shared = load_mlp(loader, blk(l, "ffn_gate_shexp.weight"), blk(l, "ffn_up_shexp.weight"), blk(l, "ffn_down_shexp.weight"),
                        m.shared_ffn, expert_share_.shared_ffn);
    if (m.shared_gate) L.shared_gate = loader.matrix(blk(l, "ffn_gate_inp_shexp.weight"), 1, d);
  }
}

float* MoeDecoderModel::scratch(size_t slot, int64_t floats) {
  if (floats > scratch_floats_[slot] || !scratch_[slot]) {  // a first call may ask for 0 floats (an empty dispatch)
    graphs_.drop();  // captured graphs read the buffer about to be replaced
    const int64_t n = std::max<int64_t>(floats, 1024);
    scratch_[slot] = backend_.allocate(static_cast<size_t>(n) * sizeof(float));
    scratch_floats_[slot] = n;
  }
  return static_cast<float*>(scratch_[slot]->data());
}

template <class T>
const T* MoeDecoderModel::on_backend(size_t slot, const T* values, int64_t n) {
  static_assert(sizeof(T) == sizeof(float), "scratch slots hold 4-byte values");
  if (backend_.host_memory()) return values;
  scratch(slot, n);
  if (n > 0) backend_.upload(*scratch_[slot], 0, values, static_cast<size_t>(n) * sizeof(T));
  return reinterpret_cast<const T*>(scratch_[slot]->data());
}

BatchIndices MoeDecoderModel::place_indices(const Batch& batch) {
  return place_batch_indices(backend_, batch, packed_indices_, [&](const std::vector<int32_t>& packed) {
    return on_backend(kIndices, packed.data(), static_cast<int64_t>(packed.size()));
  });
}

void MoeDecoderModel::forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits) {
  const auto n_out = static_cast<int64_t>(batch.logits_indices.size());
  for (const int32_t row : batch.logits_indices) {
    if (row < 0 || row >= batch.n_tokens()) throw Error(ErrorKind::kInternal, "logits index out of range");
  }
  if (batch.n_tokens() == 0 || n_out == 0) {
    if (batch.n_tokens() > 0) run(batch, kv);
    else if (moe_comm_ != nullptr) run_idle();
    count_device_routing();
    logits.clear();
    return;
  }
  run(batch, kv);
  count_device_routing();
  if (parallel_.tp_size > 1) {
    gather_vocab_logits(backend_, parallel_, config_.vocab, static_cast<const float*>(scratch_[kLogits]->data()), n_out, gathered_, logits);
    return;
  }
  logits.resize(static_cast<size_t>(n_out * config_.vocab));
  backend_.download(logits.data(), *scratch_[kLogits], 0, logits.size() * sizeof(float));
}

void MoeDecoderModel::forward_sampled(const Batch&, KvStorage&, std::span<const SampleRow>, std::vector<int32_t>&) {
  throw Error(ErrorKind::kInternal, "forward_sampled: this model samples on the host (device_sampling() is false)");
}

void MoeDecoderModel::run(const Batch& batch, KvStorage& kv) {
  if (forward_graph(batch, kv)) return;
  const int64_t n = batch.n_tokens(), d = config_.hidden;
  float* x = scratch(kX, n * d);
  const BatchIndices ix = place_indices(batch);
  if (nextn_block_ >= 0 || eagle_) embed_head_input(batch, ix.tokens, x);
  else backend_.embed(tok_embd_, ix.tokens, n, x);
  if (moe_comm_ != nullptr && !parallel_.moe_all_to_all) exchange_replica_sizes(n);
  if (batch.has_tree() && !backend_.supports_tree_attention()) {
    throw_unsupported("draft-tree verification (speculative_eagle_topk > 1) needs tree attention, which the " +
                      backend_.name() + " backend does not have");
  }
  const AttentionBatch ab{n, ix.positions, ix.seq_of_token, ix.block_tables, batch.max_blocks_per_seq,
                          ix.tree_base, ix.tree_mask};
  forward_layers(n, ab, ix.slots, kv);
  const float eps = config_.rms_eps;
  if (batch.return_hidden) {
    hidden_.resize(static_cast<size_t>(n * d));
    // An EAGLE head's output has no final norm.
    if (output_norm_ != nullptr) backend_.rms_norm(x, output_norm_, scratch(kHidden, n * d), n, d, eps);
    backend_.download(hidden_.data(), *scratch_[output_norm_ != nullptr ? kHidden : kX], 0, hidden_.size() * sizeof(float));
  } else {
    hidden_.clear();
  }
  output_head(n, static_cast<int64_t>(batch.logits_indices.size()), ix.logits_rows);
}

bool MoeDecoderModel::forward_graph(const Batch& batch, KvStorage& kv) {
  if (parallel_.tp_size != 1 || batch.return_hidden || batch.has_tree() || !graphs_.takes(batch)) return false;
  const DecodeGraphs::Step step = graphs_.prepare(batch, kv);
  const int64_t n = step.bucket;
  graphs_.run(step, [&] {
    real_tokens_ = step.real_tokens;
    try {
      backend_.embed(tok_embd_, step.ix.tokens, n, scratch(kX, n * config_.hidden));
      const AttentionBatch ab{n, step.ix.positions, step.ix.seq_of_token, step.ix.block_tables, step.width, nullptr, nullptr};
      forward_layers(n, ab, step.ix.slots, kv);
      output_head(n, n, step.ix.logits_rows);
    } catch (...) {
      real_tokens_ = nullptr;
      throw;
    }
    real_tokens_ = nullptr;
  });
  hidden_.clear();
  // A replay routes every MoE layer without moe_on_device running on the host.
  routed_layers_.clear();
  for (const Layer& L : layers_) {
    if (L.moe) routed_layers_.push_back(&L);
  }
  return true;  // logits rows [0, batch's tokens) are the real sequences'
}

// The decoder layers over x (kX) for n tokens: x becomes the last layer's residual stream.
void MoeDecoderModel::forward_layers(int64_t n, const AttentionBatch& ab, const int32_t* slots, KvStorage& kv) {
  const int64_t d = config_.hidden;
  float* x = scratch(kX, n * d);
  float* h = scratch(kH, n * d);
  float* out = scratch(kOut, n * d);
  const float eps = config_.rms_eps;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const KvLayerView& cache = kv.layer(static_cast<int64_t>(l));
    // compile = fused: each residual add joins the RMSNorm after it (the same arithmetic in one pass).
    if (L.attn_norm == nullptr) backend_.copy_rows(x, d, h, d, n, d);  // an EAGLE head's first layer
    else if (!fused_ || l == 0) backend_.rms_norm(x, L.attn_norm, h, n, d, eps);
    else backend_.add_rms_norm(x, out, L.attn_norm, h, n, d, eps);
    if (config_.is_mla()) attention_mla(L, n, h, cache, ab, slots, out);
    else attention_gqa(L, n, h, cache, ab, slots, out);
    sum_partials(backend_, parallel_, out, n * d);  // this rank's heads' share of the output projection
    if (fused_) {
      backend_.add_rms_norm(x, out, L.ffn_norm, h, n, d, eps);
    } else {
      backend_.add(x, out, n * d);
      backend_.rms_norm(x, L.ffn_norm, h, n, d, eps);
    }
    if (L.moe && moe_comm_ != nullptr && parallel_.moe_all_to_all) moe_all_to_all(L, n, h, out);
    else if (L.moe && moe_comm_ != nullptr) moe_over_replicas(L, n, h, out);
    else if (L.moe) moe(L, n, h, kOut);
    else mlp(L.dense, n, h, out);
    sum_partials(backend_, parallel_, out, n * d);  // the ranks' intermediate-dimension and expert parts
    if (!fused_) backend_.add(x, out, n * d);
  }
  if (fused_) backend_.add(x, out, n * d);
}

// The output head over rows logits_rows[0, n_out) of x (n rows): logits in kLogits (or through the draft vocabulary).
void MoeDecoderModel::output_head(int64_t n, int64_t n_out, const int32_t* logits_rows) {
  if (n_out == 0) return;
  const int64_t d = config_.hidden;
  const float eps = config_.rms_eps;
  float* x = scratch(kX, n * d);
  float* xs = scratch(kLogitsIn, n_out * d);
  const WeightMatrix hidden{x, DType::kF32, n, d, d * static_cast<int64_t>(sizeof(float))};
  backend_.embed(hidden, logits_rows, n_out, xs);
  if (output_norm_ != nullptr) backend_.rms_norm(xs, output_norm_, xs, n_out, d, eps);
  if (draft_vocab_.empty()) {
    backend_.matmul(output_, nullptr, xs, n_out, scratch(kLogits, n_out * output_.rows));
    return;
  }
  backend_.matmul(output_, nullptr, xs, n_out, scratch(kDraftLogits, n_out * output_.rows));
  backend_.synchronize();
  scatter_draft_logits(n_out);
}

void MoeDecoderModel::exchange_replica_sizes(int64_t n) {
  const int replicas = moe_comm_->size();
  const int64_t mine = n * config_.hidden;
  std::vector<int64_t> all(static_cast<size_t>(replicas));
  moe_comm_->all_gather(&mine, all.data(), 1);
  replica_floats_.assign(all.begin(), all.end());
}

void MoeDecoderModel::run_idle() {
  if (parallel_.moe_all_to_all) {
    for (const Layer& L : layers_) {
      if (L.moe) moe_all_to_all(L, 0, nullptr, nullptr);
    }
    return;
  }
  exchange_replica_sizes(0);
  for (const Layer& L : layers_) {
    if (L.moe) moe_over_replicas(L, 0, nullptr, nullptr);
  }
}

void MoeDecoderModel::moe_over_replicas(const Layer& L, int64_t n, const float* h, float* out) {
  const int64_t d = config_.hidden;
  int64_t total = 0;
  for (const size_t f : replica_floats_) total += static_cast<int64_t>(f);
  const int64_t all_tokens = total / d;
  if (all_tokens == 0) return;  // every replica idle: each sees the same sizes, so none calls a collective
  float* tokens = scratch(kReplicaTokens, total);
  backend_.synchronize();
  moe_comm_->all_gatherv(n > 0 ? h : tokens, tokens, replica_floats_);
  moe(L, all_tokens, tokens, kReplicaSums);
  float* sums = scratch(kReplicaSums, total);
  backend_.synchronize();
  moe_comm_->reduce_scatter(sums, n > 0 ? out : tokens, replica_floats_, ReduceOp::kSum);
}

void MoeDecoderModel::attention_gqa(const Layer& L, int64_t n, const float* h, const KvLayerView& cache,
                                    const AttentionBatch& ab, const int32_t* slots, float* out) {
  const int64_t hd = config_.head_dim, heads = n_heads_, kv_heads = share_.kv_heads.count;
  float* q = scratch(kQ, n * heads * hd);
  float* k = scratch(kK, n * kv_heads * hd);
  float* v = scratch(kV, n * kv_heads * hd);
  const Backend::MatmulOut qkv[] = {{&L.wq, L.bq, q}, {&L.wk, L.bk, k}, {&L.wv, L.bv, v}};
  backend_.matmuls(qkv, h, n);
  if (L.q_norm != nullptr) {  // qwen3: each head's q and k normalised on their own
    backend_.rms_norm(q, L.q_norm, q, n * heads, hd, config_.rms_eps);
    backend_.rms_norm(k, L.k_norm, k, n * kv_heads, hd, config_.rms_eps);
  }
  backend_.rope(q, ab.positions, n, heads, rotary_.params());
  backend_.rope(k, ab.positions, n, kv_heads, rotary_.params());
  backend_.store_kv(cache, k, v, slots, n);
  float* attn = scratch(kAttn, n * heads * hd);
  const float scale = config_.attention_scale_factor / std::sqrt(static_cast<float>(hd));
  backend_.attention(cache, ab, q, heads, scale, attn);
  backend_.matmul(L.wo, nullptr, attn, n, out);
}

void MoeDecoderModel::attention_mla(const Layer& L, int64_t n, const float* h, const KvLayerView& cache,
                                    const AttentionBatch& ab, const int32_t* slots, float* out) {
  const MlaConfig& m = config_.mla;
  const int64_t heads = n_heads_, hd = config_.head_dim, rank = m.kv_lora_rank, rope = m.qk_rope_dim;
  const int64_t row = rank + rope;  // a cached latent row: [latent | rotary key]
  float* q = scratch(kQ, n * heads * hd);
  if (m.q_lora_rank > 0) {
    float* qa = scratch(kQA, n * m.q_lora_rank);
    backend_.matmul(L.wq_a, nullptr, h, n, qa);
    backend_.rms_norm(qa, L.q_a_norm, qa, n, m.q_lora_rank, config_.rms_eps);
    backend_.matmul(L.wq_b, nullptr, qa, n, q);
  } else {
    backend_.matmul(L.wq, nullptr, h, n, q);
  }
  float* latent = scratch(kLatent, n * rank);
  float* rope_key = scratch(kRopeKey, n * rope);
  const Backend::MatmulOut kv_a[] = {{&L.w_latent, nullptr, latent}, {&L.w_rope_key, nullptr, rope_key}};
  backend_.matmuls(kv_a, h, n);
  backend_.rms_norm(latent, L.latent_norm, latent, n, rank, config_.rms_eps);
  // Each head's query is [no-rope part | rotary part]: rotate the rotary part in place (head stride hd), and the one
  // rotary key shared by all heads.
  backend_.rope(q + m.qk_nope_dim, ab.positions, n, heads, rotary_.params());
  RopeParams key_rope = rotary_.params();
  key_rope.head_dim = rope;
  backend_.rope(rope_key, ab.positions, n, 1, key_rope);
  backend_.store_latent(cache, latent, rank, rope_key, slots, n);

  float* q_absorbed = scratch(kQAbsorbed, n * heads * row);
  backend_.head_matmul(L.w_uk_t, heads, q, {heads * hd, hd}, n, q_absorbed, {heads * row, row});
  backend_.copy_rows(q + m.qk_nope_dim, hd, q_absorbed + rank, row, n * heads, rope);
  float* attn_latent = scratch(kAttnLatent, n * heads * rank);
  const float scale = config_.attention_scale_factor / std::sqrt(static_cast<float>(hd));
  backend_.attention_latent(cache, ab, q_absorbed, heads, rank, scale, attn_latent);
  float* attn = scratch(kAttn, n * heads * m.v_head_dim);
  backend_.head_matmul(L.w_uv, heads, attn_latent, {heads * rank, rank}, n, attn, {heads * m.v_head_dim, m.v_head_dim});
  backend_.matmul(L.wo, nullptr, attn, n, out);
}

void MoeDecoderModel::mlp(const Mlp& w, int64_t n, const float* h, float* out) {
  const Backend::ExpertMlp all_rows[] = {{&w.gate, &w.up, &w.down, 0, n}};
  backend_.expert_mlps(all_rows, h, out);
}

void MoeDecoderModel::zero_scratch(size_t slot, int64_t floats) {
  float* dst = scratch(slot, floats);
  if (zeros_.size() < static_cast<size_t>(floats)) zeros_.resize(static_cast<size_t>(floats), 0.0f);
  if (backend_.host_memory()) {
    backend_.upload(*scratch_[slot], 0, zeros_.data(), static_cast<size_t>(floats) * sizeof(float));
    return;
  }
  // A device copy of zeros, so a graph step writes them without host work.
  if (!zero_rows_ || zero_rows_->size() < static_cast<size_t>(floats) * sizeof(float)) {
    graphs_.drop();
    zero_rows_ = backend_.allocate(static_cast<size_t>(floats) * sizeof(float));
    backend_.upload(*zero_rows_, 0, zeros_.data(), static_cast<size_t>(floats) * sizeof(float));
  }
  backend_.copy_rows(static_cast<const float*>(zero_rows_->data()), floats, dst, floats, 1, floats);
}

void MoeDecoderModel::route(const Layer& L, int64_t n, const float* h) {
  const int64_t E = config_.moe.routing.n_experts, k = config_.moe.routing.top_k;
  float* router = scratch(kRouter, n * E);
  backend_.matmul(L.router, nullptr, h, n, router);
  // Routing runs on the host, reading the router's output in place on a host-memory backend, else downloaded.
  const float* logits = router;
  if (!backend_.host_memory()) {
    router_host_.resize(static_cast<size_t>(n * E));
    backend_.download(router_host_.data(), *scratch_[kRouter], 0, router_host_.size() * sizeof(float));
    logits = router_host_.data();
  }
  expert_ids_.resize(static_cast<size_t>(n * k));
  expert_weights_.resize(static_cast<size_t>(n * k));
  const float* bias = L.host_selection_bias.empty() ? L.selection_bias : L.host_selection_bias.data();
  route_tokens(config_.moe.routing, logits, bias, n, expert_ids_.data(), expert_weights_.data());
}

void MoeDecoderModel::place_assignments(const Layer& L, int64_t n, int64_t key) {
  if (!L.placement) return;
  const int64_t k = config_.moe.routing.top_k;
  for (int64_t i = 0; i < n * k; ++i) {
    int32_t& id = expert_ids_[static_cast<size_t>(i)];
    id = L.placement->slot_for(id, key + i / k);
  }
}

void MoeDecoderModel::count_load(const Layer& L, const std::vector<int64_t>& per_slot) {
  const int64_t E = config_.moe.routing.n_experts, per_group = slots_ / load_.ep_groups;  // expert_parallel_share checked it divides
  int64_t busiest_group = 0;
  for (int64_t g = 0; g < load_.ep_groups; ++g) {
    int64_t group = 0;
    for (int64_t slot = g * per_group; slot < (g + 1) * per_group; ++slot) group += per_slot[static_cast<size_t>(slot)];
    load_.routed += group;
    busiest_group = std::max(busiest_group, group);
  }
  int64_t busiest = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t count = 0;
    if (L.placement) {
      for (const int32_t slot : L.placement->copies[static_cast<size_t>(e)]) count += per_slot[static_cast<size_t>(slot)];
    } else {
      count = per_slot[static_cast<size_t>(e)];
    }
    busiest = std::max(busiest, count);
    distribution_[static_cast<size_t>(L.moe_index * E + e)].fetch_add(count, std::memory_order_relaxed);
  }
  load_.busiest += busiest;
  load_.busiest_group += busiest_group;
}

void MoeDecoderModel::sort_by_expert(const int32_t* experts, const int32_t* rows, const float* weights, int64_t count) {
  // A stable counting sort: each expert's rows are contiguous, so one matmul serves all of them.
  const int64_t E = slots_;
  expert_start_.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < count; ++i) ++expert_start_[static_cast<size_t>(experts[i]) + 1];
  for (int64_t e = 0; e < E; ++e) expert_start_[static_cast<size_t>(e) + 1] += expert_start_[static_cast<size_t>(e)];
  order_.resize(static_cast<size_t>(count));
  order_weights_.resize(static_cast<size_t>(count));
  std::vector<int64_t> next(expert_start_.begin(), expert_start_.end() - 1);
  for (int64_t i = 0; i < count; ++i) {
    const auto slot = static_cast<size_t>(next[static_cast<size_t>(experts[i])]++);
    order_[slot] = rows[i];
    order_weights_[slot] = weights[i];
  }
}

void MoeDecoderModel::add_own_experts(const Layer& L, const WeightMatrix& x, float* out) {
  // This rank's experts are contiguous ids, so their assignments are one contiguous run [lo, hi) of the order.
  const SliceRange mine = expert_share_.experts;
  const int64_t d = config_.hidden;
  const int64_t lo = expert_start_[static_cast<size_t>(mine.begin)], hi = expert_start_[static_cast<size_t>(mine.begin + mine.count)];
  if (hi == lo) return;  // no token picked this rank's experts (expert parallelism)
  float* gathered = scratch(kGathered, (hi - lo) * d);
  float* expert_out = scratch(kExpertOut, (hi - lo) * d);
  const int32_t* rows = on_backend(kOrderRows, order_.data() + lo, hi - lo);
  const float* weights = on_backend(kOrderWeights, order_weights_.data() + lo, hi - lo);
  backend_.embed(x, rows, hi - lo, gathered);
  experts_.clear();
  for (int64_t e = mine.begin; e < mine.begin + mine.count; ++e) {
    const int64_t first = expert_start_[static_cast<size_t>(e)], count = expert_start_[static_cast<size_t>(e) + 1] - first;
    const Mlp& w = L.experts[static_cast<size_t>(e - mine.begin)];
    if (count > 0) experts_.push_back({&w.gate, &w.up, &w.down, first - lo, count});
  }
  backend_.expert_mlps(experts_, gathered, expert_out);
  backend_.scatter_add_rows(expert_out, rows, weights, hi - lo, d, out);
}

void MoeDecoderModel::shared_experts(const Layer& L, int64_t n, const float* h, size_t out_slot) {
  const int64_t d = config_.hidden;
  float* out = scratch(out_slot, n * d);
  if (config_.moe.shared_ffn > 0 && L.shared_gate.data == nullptr) {
    mlp(L.shared, n, h, out);  // the routed outputs are added onto the shared expert's
    return;
  }
  zero_scratch(out_slot, n * d);
  if (config_.moe.shared_ffn == 0) return;
  // qwen2_moe: the shared expert scaled by sigmoid(x . w) per token.
  float* shared = scratch(kSharedOut, n * d);
  mlp(L.shared, n, h, shared);
  float* gate = scratch(kSharedGate, n);
  backend_.matmul(L.shared_gate, nullptr, h, n, gate);
  std::vector<float> weights(static_cast<size_t>(n));
  backend_.download(weights.data(), *scratch_[kSharedGate], 0, weights.size() * sizeof(float));
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    weights[static_cast<size_t>(t)] = 1.0f / (1.0f + std::exp(-weights[static_cast<size_t>(t)]));
    rows[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  }
  backend_.scatter_add_rows(shared, on_backend(kSharedRows, rows.data(), n), on_backend(kSharedWeights, weights.data(), n),
                            n, d, out);
}

void MoeDecoderModel::moe(const Layer& L, int64_t n, const float* h, size_t out_slot) {
  if (device_routing_) {
    moe_on_device(L, n, h, out_slot);
    return;
  }
  const int64_t d = config_.hidden, E = slots_, k = config_.moe.routing.top_k;
  route(L, n, h);
  place_assignments(L, n, 0);  // every rank has every token here, so the same copies
  assignment_rows_.resize(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) assignment_rows_[static_cast<size_t>(i)] = static_cast<int32_t>(i / k);
  sort_by_expert(expert_ids_.data(), assignment_rows_.data(), expert_weights_.data(), n * k);
  // Counted over all experts on every rank alike (each routes every token); the engine reads rank 0's counters. With
  // DP attention every replica routes every replica's tokens, and the front sums the replicas: the first counts them.
  if (moe_comm_ == nullptr || moe_comm_->rank() == 0) {
    std::vector<int64_t> per_expert(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) per_expert[static_cast<size_t>(e)] = expert_start_[static_cast<size_t>(e) + 1] - expert_start_[static_cast<size_t>(e)];
    count_load(L, per_expert);
  }
  shared_experts(L, n, h, out_slot);
  const WeightMatrix tokens{h, DType::kF32, n, d, d * static_cast<int64_t>(sizeof(float))};
  add_own_experts(L, tokens, scratch(out_slot, n * d));
}

void MoeDecoderModel::moe_on_device(const Layer& L, int64_t n, const float* h, size_t out_slot) {
  const int64_t d = config_.hidden, E = config_.moe.routing.n_experts, count = n * config_.moe.routing.top_k;
  float* router = scratch(kRouter, n * E);
  backend_.matmul(L.router, nullptr, h, n, router);
  auto* rows = reinterpret_cast<int32_t*>(scratch(kOrderRows, count));  // 4-byte slots
  float* weights = scratch(kOrderWeights, count);
  // This layer's runs stay on the device for the step; count_device_routing() reads them once it ends.
  if (!routed_offsets_) routed_offsets_ = backend_.allocate(static_cast<size_t>(moe_layers_ * (E + 1)) * sizeof(int32_t));
  int32_t* offsets = static_cast<int32_t*>(routed_offsets_->data()) + L.moe_index * (E + 1);
  backend_.group_by_expert(config_.moe.routing, router, L.selection_bias, n, real_tokens_, rows, weights, offsets);
  routed_layers_.push_back(&L);
  float* gathered = scratch(kGathered, count * d);
  backend_.embed(WeightMatrix{h, DType::kF32, n, d, d * static_cast<int64_t>(sizeof(float))}, rows, count, gathered);
  shared_experts(L, n, h, out_slot);
  float* expert_out = scratch(kExpertOut, count * d);
  backend_.expert_mlps_grouped(L.expert_weights, offsets, count, gathered, expert_out);
  backend_.scatter_add_rows(expert_out, rows, weights, count, d, scratch(out_slot, n * d));
}

void MoeDecoderModel::count_device_routing() {
  if (routed_layers_.empty()) return;
  const int64_t E = config_.moe.routing.n_experts;
  std::vector<int32_t> offsets(static_cast<size_t>(moe_layers_ * (E + 1)));
  backend_.download(offsets.data(), *routed_offsets_, 0, offsets.size() * sizeof(int32_t));
  std::vector<int64_t> per_expert(static_cast<size_t>(E));
  for (const Layer* L : routed_layers_) {
    const int32_t* o = offsets.data() + L->moe_index * (E + 1);
    for (int64_t e = 0; e < E; ++e) per_expert[static_cast<size_t>(e)] = o[e + 1] - o[e];
    count_load(*L, per_expert);
  }
  routed_layers_.clear();
}

void MoeDecoderModel::moe_all_to_all(const Layer& L, int64_t n, const float* h, float* out) {
  const int64_t d = config_.hidden, E = slots_, k = config_.moe.routing.top_k;
  const int ranks = moe_comm_->size(), me = moe_comm_->rank();
  if (n > 0) {
    route(L, n, h);
    place_assignments(L, n, me);  // replicas' first tokens start at different copies
  }
  // The layout, as DeepEP's dispatch computes it: per rank its assignments per expert and its rows for each rank (a
  // token goes once to every rank owning any of its experts). Every rank learns every rank's layout in one gather.
  const int64_t layout_size = E + ranks;
  const auto owns = [&](int r, int32_t e) {
    const SliceRange owned = rank_experts_[static_cast<size_t>(r)];
    return e >= owned.begin && e < owned.begin + owned.count;
  };
  std::vector<int64_t> layout(static_cast<size_t>(layout_size), 0);
  std::vector<std::vector<int32_t>> to_rank(static_cast<size_t>(ranks));
  for (int64_t t = 0; t < n; ++t) {
    for (int r = 0; r < ranks; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        if (owns(r, expert_ids_[static_cast<size_t>(t * k + j)])) {
          to_rank[static_cast<size_t>(r)].push_back(static_cast<int32_t>(t));
          break;
        }
      }
    }
  }
  for (int64_t i = 0; i < n * k; ++i) ++layout[static_cast<size_t>(expert_ids_[static_cast<size_t>(i)])];
  for (int r = 0; r < ranks; ++r) layout[static_cast<size_t>(E + r)] = static_cast<int64_t>(to_rank[static_cast<size_t>(r)].size());
  std::vector<int64_t> layouts(static_cast<size_t>(ranks * layout_size));
  backend_.synchronize();
  moe_comm_->all_gather(layout.data(), layouts.data(), static_cast<size_t>(layout_size));
  const auto layout_of = [&](int r, int64_t i) { return layouts[static_cast<size_t>(r * layout_size + i)]; };
  if (me == 0) {  // the global per-expert load, as the gathering scheme counts it (the front sums the replicas)
    std::vector<int64_t> per_expert(static_cast<size_t>(E), 0);
    for (int r = 0; r < ranks; ++r) {
      for (int64_t e = 0; e < E; ++e) per_expert[static_cast<size_t>(e)] += layout_of(r, e);
    }
    count_load(L, per_expert);
  }
  int64_t dispatched_anywhere = 0;
  for (int r = 0; r < ranks; ++r) {
    for (int p = 0; p < ranks; ++p) dispatched_anywhere += layout_of(r, E + p);
  }
  if (dispatched_anywhere == 0) return;  // every replica idle: all see the same layouts, so none calls a collective

  // Dispatch: a row is [hidden state | its k expert ids (-1 where the receiving rank does not own one) | weights].
  const int64_t width = d + 2 * k;
  std::vector<size_t> send_counts(static_cast<size_t>(ranks)), recv_counts(static_cast<size_t>(ranks));
  int64_t sent = 0, received = 0;
  for (int r = 0; r < ranks; ++r) {
    send_counts[static_cast<size_t>(r)] = to_rank[static_cast<size_t>(r)].size() * static_cast<size_t>(width);
    recv_counts[static_cast<size_t>(r)] = static_cast<size_t>(layout_of(r, E + me) * width);
    sent += static_cast<int64_t>(to_rank[static_cast<size_t>(r)].size());
    received += layout_of(r, E + me);
  }
  float* send = scratch(kDispatch, sent * width);
  float* recv = scratch(kDispatched, received * width);
  std::vector<int32_t> token_of;  // the token of each sent row, in send order (the combine's rows come back in it)
  for (int r = 0; r < ranks; ++r) {
    for (const int32_t t : to_rank[static_cast<size_t>(r)]) {
      float* dst = send + static_cast<int64_t>(token_of.size()) * width;
      token_of.push_back(t);
      std::copy_n(h + t * d, d, dst);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = expert_ids_[static_cast<size_t>(t * k + j)];
        const bool here = owns(r, e);
        dst[d + j] = here ? static_cast<float>(e) : -1.0f;  // expert ids are exact in a float
        dst[d + k + j] = here ? expert_weights_[static_cast<size_t>(t * k + j)] : 0.0f;
      }
    }
  }
  moe_comm_->all_to_allv(send, send_counts, recv, recv_counts);

  // This rank's experts over the rows it received, their weighted sums per row.
  std::vector<int32_t> experts, rows;
  std::vector<float> weights;
  for (int64_t i = 0; i < received; ++i) {
    const float* r = recv + i * width;
    for (int64_t j = 0; j < k; ++j) {
      if (r[d + j] < 0.0f) continue;
      experts.push_back(static_cast<int32_t>(r[d + j]));
      rows.push_back(static_cast<int32_t>(i));
      weights.push_back(r[d + k + j]);
    }
  }
  float* sums = scratch(kCombine, received * d);
  if (received > 0) {
    zero_scratch(kCombine, received * d);
    sort_by_expert(experts.data(), rows.data(), weights.data(), static_cast<int64_t>(experts.size()));
    add_own_experts(L, WeightMatrix{recv, DType::kF32, received, d, width * static_cast<int64_t>(sizeof(float))}, sums);
  }

  // Combine: the sums go back to the rows' replicas, which add them (in rank order) onto their shared experts.
  for (int r = 0; r < ranks; ++r) {
    std::swap(send_counts[static_cast<size_t>(r)], recv_counts[static_cast<size_t>(r)]);
    send_counts[static_cast<size_t>(r)] = send_counts[static_cast<size_t>(r)] / static_cast<size_t>(width) * static_cast<size_t>(d);
    recv_counts[static_cast<size_t>(r)] = recv_counts[static_cast<size_t>(r)] / static_cast<size_t>(width) * static_cast<size_t>(d);
  }
  float* back = scratch(kCombined, sent * d);
  backend_.synchronize();
  moe_comm_->all_to_allv(sums, send_counts, back, recv_counts);
  if (n == 0) return;
  shared_experts(L, n, h, kSharedSum);
  float* total = scratch(kSharedSum, n * d);
  const std::vector<float> ones(token_of.size(), 1.0f);
  backend_.scatter_add_rows(back, token_of.data(), ones.data(), sent, d, total);
  backend_.copy_rows(total, d, out, d, n, d);
}

}  // namespace servetune
