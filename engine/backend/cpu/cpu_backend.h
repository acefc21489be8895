// The CPU backend: reference ops parallelised over one thread pool, plus the SIMD matmul kernels.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/background_prefetch.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"

namespace servetune::cpu {

// The kernel built for the selected ISA: AVX-512, else AVX2, else the reference.
template <class Kernel>
Kernel for_selected_isa(Kernel avx512, Kernel avx2, Kernel reference) {
  const CpuIsa isa = cpu_selected_isa();
  return isa == CpuIsa::kAvx512 ? avx512 : isa >= CpuIsa::kAvx2 ? avx2 : reference;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);
  std::string name() const override { return "cpu"; }
  bool host_memory() const override { return true; }
  bool supports_kv_dtype(DType t) const override {
    return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kFP8_E4M3;
  }
  ThreadPool& pool() { return pool_; }

  std::unique_ptr<Buffer> allocate(size_t bytes) override;
  void make_resident(Buffer& buffer) override;  // faults the pages in, split over the pool
  void upload(Buffer& dst, size_t offset, const void* src, size_t bytes) override;
  void download(void* dst, const Buffer& src, size_t offset, size_t bytes) override;

  void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) override;
  void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) override;
  void matmul(const WeightMatrix& w, const float* bias, const float* x, int64_t n, float* y) override;
  void matmuls(std::span<const MatmulOut> outs, const float* x, int64_t n) override;
  void rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) override;
  void store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n) override;
  bool supports_tree_attention() const override { return true; }
  void copy_kv_slots(const KvLayerView& kv, const int32_t* src, const int32_t* dst, int64_t n) override;
  void attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                 float* out) override;
  // Batched matmuls until that attention fetch the batch's cache rows into L2 (whence the L3 keeps them) a few
  // lines per tile, when they are too many for the attention's own prefetch to hide DRAM latency.
  void prefetch_attention(const KvLayerView& kv, const AttentionBatch& batch) override;
  void silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) override;
  void silu_mul_matmul(const WeightMatrix& w, const float* gate, const float* up, int64_t in_stride, int64_t n,
                       float* act, float* y) override;
  void add(float* x, const float* y, int64_t n) override;
  void add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps) override;
  void rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots, int64_t n,
                      int64_t n_heads, const RopeParams& p, float* q_out) override;
  // Mixture-of-experts and latent-attention ops (latent_ops.cpp).
  void scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n, int64_t width,
                        float* dst) override;
  void expert_mlps(std::span<const ExpertMlp> experts, const float* x, float* y) override;
  void head_matmul(const WeightMatrix& w, int64_t n_heads, const float* x, HeadStrides x_strides, int64_t n, float* y,
                   HeadStrides y_strides) override;
  void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t n, int64_t width) override;
  void store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width, const float* rope_key,
                    const int32_t* slots, int64_t n) override;
  void attention_latent(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                        int64_t v_dim, float scale, float* out) override;
  // Sampling stays in host memory either way; drawing here splits a batch's rows over the pool (the host Sampler
  // draws them one after another on the engine thread) and skips copying the logits out.
  bool device_sampling() const override { return true; }
  void sample(const float* logits, int64_t n, int64_t vocab, std::span<const SampleRow> rows, int32_t* tokens) override;

 private:
  // Rows of ref::rope_cache for positions [0, max_position] under `p`, computed once per position (every layer's
  // Q and K rotate by the same angles); rebuilt when the parameters change.
  const float* rope_rows(const RopeParams& p, int32_t max_position);
  // rope_rows covering every position of the batch, or nullptr when one lies outside the table (negative, past
  // 65536, or no rotary dims): then the per-token reference path computes its own angles.
  const float* rope_table_for(const int32_t* positions, int64_t n, const RopeParams& p);

  ThreadPool pool_;
  std::vector<std::vector<float>> scratch_;  // per-thread attention scores
  std::vector<std::pair<int64_t, int64_t>> runs_;  // attention's token runs [t0, t1), kept for their capacity
  RopeParams rope_key_;
  std::vector<float> rope_rows_;
  BackgroundPrefetch background_;
  // background_ while it has ranges to fetch, else null (the matmuls' argument).
  BackgroundPrefetch* background() { return background_.active() ? &background_ : nullptr; }
};

}  // namespace servetune::cpu
