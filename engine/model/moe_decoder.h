// The mixture-of-experts decoder families: Mixtral, Qwen2-MoE, Qwen3-MoE (grouped-query attention, Qwen3's per-head
// q/k norm) and DeepSeek-V2/V3 (multi-head latent attention over a cache of latent rows). Each layer's FFN is either
// the dense SwiGLU MLP or routed experts (backend/moe_routing.h picks them per token) plus optional shared experts.
// Runs on the CPU and GPU backends; compile = graphs is refused, not ignored. Routing runs on the host: on a device
// backend the router's logits come down and the sorted assignments go up each MoE layer, and the weights derived on
// the host at load (MLA's absorbed projections, the routers' selection bias) are read through a host-memory loader.
// DP attention and draft vocabularies need a host-memory backend.
// Under tensor parallelism one instance is one rank's shard, as LlamaModel's (see parallel.h): attention by heads
// (MLA: q_b / kv_b / o_proj by heads, the latent projections and cache row whole on every rank), dense and shared
// MLPs by their intermediate dimension, routed experts by expert-parallel group and then by intermediate dimension.
// Every rank routes every token (the hidden states are whole after each all-reduce), computes only its own experts'
// share, and the all-reduce after the FFN adds the ranks' parts: SGLang's expert parallelism without DeepEP.
// With DP attention (parallel.h) each rank is a replica with its own tokens; a MoE layer all-gathers every replica's
// tokens, computes this rank's expert share of all of them, and reduce-scatters the sums back to their replicas
// (SGLang's gather/scatter); or, with moe_all_to_all (SGLang's --moe-a2a-backend deepep), routes its own tokens, sends
// each one only to the ranks owning its experts and adds their weighted sums, sent back, onto its own shared experts'
// output (DeepEP's dispatch and combine). A replica with no tokens still joins each layer's collectives (forward on
// an empty Batch: the idle batch).
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/expert_placement.h"
#include "model/batch_indices.h"
#include "model/model.h"
#include "model/rotary.h"
#include "backend/moe_routing.h"
#include "model/decode_graphs.h"
#include "model/weight_loader.h"

namespace servetune {

//
// Next-n mode (DeepSeek-V3's multi-token-prediction layer j, stored as blk.{n_layers + j}, as SGLang's
// DeepseekModelNextN runs it): a one-layer model whose input per token is the embedding of token t_{i+1} and the
// target's final hidden state h_i (Batch::input_hidden) at position i: x = eh_proj([enorm(embed(t)); hnorm(h)]), then
// the decoder layer, then its shared head (shared_head.norm, shared_head.head) predicts t_{i+2}. Its hidden_rows() are
// the shared-head-normalised states, which a chained draft step feeds back as h.
//
// EAGLE mode (EAGLE-2's head, SGLang's LlamaForCausalLMEagle; model/eagle_head.h loads it): the same input pair
// through fc([embed(t); h]) (+ bias) without norms, one dense decoder layer whose input norm is optional, and the
// target's head applied to the layer's output without a final norm; hidden_rows() are that output.
//
// Either head may score a draft vocabulary only (FR-Spec, SGLang's --speculative-token-map): its output head is the
// target's rows for those token ids, and the logits of every other token are -inf (never drafted; a sampled draft's
// q is 0 there, which verification handles as any other q).
class MoeDecoderModel final : public Model {
 public:
  MoeDecoderModel(const ModelConfig& config, WeightLoader& loader, Backend& backend, ParallelContext parallel,
                  CompileOptions compile = {});
  // Next-n layer `nextn` of the target model `target` (Error(kUsage) naming the tensor when the checkpoint lacks it).
  // `draft_vocab` (sorted target ids; empty: all) restricts the head's output as above.
  static std::unique_ptr<MoeDecoderModel> next_n(const ModelConfig& target, int64_t nextn, WeightLoader& loader,
                                                 Backend& backend, std::span<const int32_t> draft_vocab = {});
  // An EAGLE head of config `head` (one layer) whose loader finds eagle_fc.weight [d, 2d] (and eagle_fc.bias), the
  // layer as blk.0.*, and the target's token_embd / output.
  static std::unique_ptr<MoeDecoderModel> eagle_head(const ModelConfig& head, WeightLoader& loader, Backend& backend,
                                                     std::span<const int32_t> draft_vocab = {});

  const ModelConfig& config() const override { return config_; }
  const ParallelContext& parallel() const override { return parallel_; }
  int64_t local_kv_heads() const override { return share_.kv_heads.count; }
  void forward(const Batch& batch, KvStorage& kv, std::vector<float>& logits) override;
  bool device_sampling() const override { return false; }
  std::span<const float> hidden_rows() const override { return hidden_; }
  bool supports_hidden() const override { return true; }
  void forward_sampled(const Batch& batch, KvStorage& kv, std::span<const SampleRow> rows, std::vector<int32_t>& tokens) override;

  ExpertLoad expert_load() const override { return load_; }
  std::vector<std::vector<int64_t>> expert_distribution() const override;

 private:
  MoeDecoderModel(const ModelConfig& config, WeightLoader& loader, Backend& backend, ParallelContext parallel,
                  CompileOptions compile, int64_t nextn_block, bool eagle, std::span<const int32_t> draft_vocab);

  struct Mlp {
    WeightMatrix gate, up, down;
  };
  struct Layer {
    int64_t moe_index = -1;                        // among the MoE layers (-1: dense)
    const ExpertPlacement* placement = nullptr;    // its experts' slots; null: slot e holds expert e
    const float* attn_norm = nullptr;
    // Grouped-query attention.
    WeightMatrix wq, wk, wv;
    const float* bq = nullptr;
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* q_norm = nullptr;  // qwen3: per-head RMSNorm weights [head_dim]
    const float* k_norm = nullptr;
    // Latent attention: q straight (wq) or through its low-rank pair; the latent and rotary-key projections; the
    // key part of kv_b transposed per head for absorbing it into q, and its value part per head.
    WeightMatrix wq_a, wq_b;
    const float* q_a_norm = nullptr;
    WeightMatrix w_latent, w_rope_key;
    const float* latent_norm = nullptr;
    WeightMatrix w_uk_t;  // [n_heads * kv_lora_rank, qk_nope_dim], f32
    WeightMatrix w_uv;    // [n_heads * v_head_dim, kv_lora_rank]
    WeightMatrix wo;
    const float* ffn_norm = nullptr;
    // FFN: dense, or routed experts (+ shared).
    Mlp dense;
    bool moe = false;
    WeightMatrix router;
    const float* selection_bias = nullptr;
    std::vector<float> host_selection_bias;  // a device backend's host copy of it, for host routing
    std::vector<Mlp> experts;
    std::vector<Backend::ExpertWeights> expert_weights;  // the same matrices as expert_mlps_grouped takes them
    Mlp shared;
    WeightMatrix shared_gate;  // qwen2_moe: [1, hidden]
    // experts[i] is routed expert expert_share_.experts.begin + i (this rank's ones, each its expert_ffn part).
  };

  BatchIndices place_indices(const Batch& batch);  // uploaded once per step on a device backend
  // `n` host values (4 bytes each) where the backend's ops read them: in place on a host-memory backend, else
  // uploaded into scratch slot `slot`.
  template <class T>
  const T* on_backend(size_t slot, const T* values, int64_t n);
  void load_attention(Layer& L, int64_t l, WeightLoader& loader);
  void load_ffn(Layer& L, int64_t l, WeightLoader& loader);
  // A SwiGLU MLP's shard: gate/up rows and down columns [ffn).
  Mlp load_mlp(WeightLoader& loader, const std::string& gate, const std::string& up, const std::string& down, int64_t width,
               SliceRange ffn);
  float* scratch(size_t slot, int64_t floats);
  void zero_scratch(size_t slot, int64_t floats);  // the slot's first `floats` values set to 0
  void attention_gqa(const Layer& L, int64_t n, const float* h, const KvLayerView& cache, const AttentionBatch& ab,
                     const int32_t* slots, float* out);
  void attention_mla(const Layer& L, int64_t n, const float* h, const KvLayerView& cache, const AttentionBatch& ab,
                     const int32_t* slots, float* out);
  void mlp(const Mlp& m, int64_t n, const float* h, float* out);
  // Routed (+ shared) experts of `n` tokens `h` into the scratch slot `out_slot` (its sum, on this rank's share).
  void moe(const Layer& L, int64_t n, const float* h, size_t out_slot);
  // moe() with routing, grouping and the experts on the device (device_routing_): no host round trip in the layer.
  void moe_on_device(const Layer& L, int64_t n, const float* h, size_t out_slot);
  // The load counters of the layers moe_on_device routed this step, from their offsets (one download at its end).
  void count_device_routing();
  // DP attention: gathers every replica's tokens, runs moe() on all of them, scatters the sums back into `out`.
  void moe_over_replicas(const Layer& L, int64_t n, const float* h, float* out);
  // DP attention with all-to-all dispatch: this replica's `n` tokens `h` to their experts' ranks and back into `out`;
  // meanwhile this rank's experts serve the rows the others sent.
  void moe_all_to_all(const Layer& L, int64_t n, const float* h, float* out);
  // The router and top-k of `n` tokens: expert_ids_, expert_weights_ ([n, top_k]).
  void route(const Layer& L, int64_t n, const float* h);
  // The routed assignments of expert_ids_ (n tokens) moved to the expert slots their copies hold; `key` offsets the
  // tokens' indices, which pick the copies (expert_placement.h).
  void place_assignments(const Layer& L, int64_t n, int64_t key);
  // Adds one step's assignments per expert slot (all ranks' tokens) of layer `L` to the load counters.
  void count_load(const Layer& L, const std::vector<int64_t>& per_slot);
  // Assignment i (row rows[i] of the experts' input, slot experts[i], weight weights[i]) sorted by slot, stably:
  // order_, order_weights_ and each slot's start in them, expert_start_ [slots + 1].
  void sort_by_expert(const int32_t* experts, const int32_t* rows, const float* weights, int64_t count);
  // Adds this rank's experts' weighted outputs over the sorted assignments (rows of `x`) into `out`'s rows.
  void add_own_experts(const Layer& L, const WeightMatrix& x, float* out);
  // The scratch slot `out_slot` [n, hidden] = the shared experts' output of `h` (qwen2_moe: gated), or zeros.
  void shared_experts(const Layer& L, int64_t n, const float* h, size_t out_slot);
  void place_experts();
  void load_next_n_inputs(WeightLoader& loader, int64_t block);
  void load_eagle_inputs(WeightLoader& loader);
  // output_ = the output head `name`'s rows for draft_vocab_, or all of it.
  void load_head_output(WeightLoader& loader, const std::string& name);
  // Logits rows [n_out, vocab] from the draft vocabulary's [n_out, draft_vocab_.size()] (-inf elsewhere).
  void scatter_draft_logits(int64_t n_out);
  // A draft head's input: x = eh_proj([enorm(embed(tokens)); hnorm(input_hidden)]) (EAGLE: no norms, fc's bias).
  void embed_head_input(const Batch& batch, const int32_t* tokens, float* x);
  void run(const Batch& batch, KvStorage& kv);
  // compile = graphs: a decode batch through a captured graph of its padded bucket (no host work inside); false when
  // the batch does not qualify.
  bool forward_graph(const Batch& batch, KvStorage& kv);
  void forward_layers(int64_t n, const AttentionBatch& ab, const int32_t* slots, KvStorage& kv);
  void output_head(int64_t n, int64_t n_out, const int32_t* logits_rows);
  void exchange_replica_sizes(int64_t n);  // DP attention: every replica's token count this step
  void run_idle();  // DP attention, no tokens here: only the MoE layers' collectives and this rank's expert share

  // Next-n mode: the checkpoint block of the layer (-1: a whole decoder) and its input norms and projection halves.
  int64_t nextn_block_ = -1;
  bool eagle_ = false;
  const float* enorm_ = nullptr;
  const float* hnorm_ = nullptr;
  WeightMatrix eh_embed_, eh_hidden_;  // eh_proj's (EAGLE: fc's) columns [0, d) (embedding) and [d, 2d) (hidden)
  const float* fc_bias_ = nullptr;     // EAGLE's fc bias, when the head has one
  std::vector<int32_t> draft_vocab_;   // the target ids output_'s rows score (empty: every token, in order)
  std::vector<float> hidden_;          // hidden_rows()

  ModelConfig config_;
  ParallelContext parallel_;
  Backend& backend_;
  bool fused_;
  TensorParallelShare share_;
  ExpertShare expert_share_;
  int64_t n_heads_;  // local query heads
  WeightMatrix tok_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  ModelRotary rotary_;
  std::vector<std::unique_ptr<Buffer>> weight_buffers_;
  // While loading for a device backend: a CPU backend and a loader on it over the same source (see the file comment).
  std::unique_ptr<Backend> host_backend_;
  std::unique_ptr<WeightLoader> host_loader_;
  std::vector<int32_t> packed_indices_;  // place_indices' staging on a device backend
  std::vector<float> router_host_;       // a device backend's router logits, downloaded for routing
  std::vector<std::unique_ptr<Buffer>> owned_;        // weights the model derived (the transposed key absorption)
  std::vector<std::unique_ptr<Buffer>> scratch_;      // activations, grown on demand
  std::vector<int64_t> scratch_floats_;
  std::vector<int32_t> expert_ids_, order_, assignment_rows_;
  std::vector<float> expert_weights_, order_weights_;
  std::vector<int64_t> expert_start_;
  std::vector<SliceRange> rank_experts_;  // all-to-all dispatch: the expert slots each rank of moe_comm_ owns
  int64_t slots_ = 0;                     // expert slots: routed experts + redundant copies
  std::vector<ExpertPlacement> placements_;  // per MoE layer; empty when every slot holds its own expert
  std::unique_ptr<std::atomic<int64_t>[]> distribution_;  // [moe layer][expert] assignments (counting rank)
  int64_t moe_layers_ = 0;
  std::vector<Backend::ExpertMlp> experts_;
  bool device_routing_ = false;             // moe_on_device (a GPU that routes; no placement, tp_size 1)
  std::unique_ptr<Buffer> routed_offsets_;  // [moe layer][expert + 1] runs of the step's device routing
  std::vector<const Layer*> routed_layers_;  // the layers moe_on_device routed this step
  DecodeGraphs graphs_;                      // compile = graphs (experts routed on the device)
  const int32_t* real_tokens_ = nullptr;     // a graph step's real token count (backend memory), for the routing
  std::unique_ptr<Buffer> zero_rows_;        // zero_scratch's source on a device backend
  std::vector<float> zeros_;  // the routed sum's starting value when no shared expert writes it first
  std::vector<float> gathered_;  // all ranks' logits before interleaving (tp_size > 1)
  Communicator* moe_comm_ = nullptr;  // DP attention: every replica (parallel.h)
  std::vector<size_t> replica_floats_;  // DP attention: this step's floats of hidden state per replica
  ExpertLoad load_;
};

}  // namespace servetune
