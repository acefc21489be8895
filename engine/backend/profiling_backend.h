// A Backend that forwards every call to another one and records the wall time of each op (synchronizing after
// it, so a GPU's queued work is charged to the op that issued it, and a kernel fault is reported naming that op); make_backend wraps the backend in one when
// SERVETUNE_PROFILE_OPS is set, and the table is written when the backend is destroyed: every op, then the ops that
// take tokens again split by tokens per call (decode batches and prompt chunks run different kernels and costs).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/backend.h"

namespace servetune {

// The size class of a call with n > 0 tokens: 0 for 1, 1 for 2-16, 2 for 17-64, 3 for 65-512, 4 for more; and its
// label.
constexpr int kTokensPerCallClasses = 5;
int tokens_per_call_class(int64_t n);
const char* tokens_per_call_label(int size_class);

class ProfilingBackend final : public Backend {
 public:
  // `destination`: "-" for stderr, else a file the table is appended to.
  ProfilingBackend(std::unique_ptr<Backend> inner, std::string destination);
  ~ProfilingBackend() override;

  // The table so far: one row per op (matmuls keyed by shape and type), heaviest first.
  std::string report() const;

  std::string name() const override { return inner_->name(); }
  bool host_memory() const override { return inner_->host_memory(); }
  DType matrix_storage_type(DType file_type) const override { return inner_->matrix_storage_type(file_type); }
  bool keeps_block_scaled(int64_t rows, int64_t cols, int64_t row_offset) const override {
    return inner_->keeps_block_scaled(rows, cols, row_offset);
  }
  std::optional<DeviceMemory> device_memory() const override { return inner_->device_memory(); }
  bool supports_kv_dtype(DType t) const override { return inner_->supports_kv_dtype(t); }
  bool supports_tree_attention() const override { return inner_->supports_tree_attention(); }
  std::unique_ptr<Buffer> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void make_resident(Buffer& buffer) override { inner_->make_resident(buffer); }
  void upload(Buffer& dst, size_t offset, const void* src, size_t bytes) override;
  void download(void* dst, const Buffer& src, size_t offset, size_t bytes) override;
  void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) override;
  void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) override;
  void matmul(const WeightMatrix& w, const float* bias, const float* x, int64_t n, float* y) override;
  void matmuls(std::span<const MatmulOut> outs, const float* x, int64_t n) override;
  void rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) override;
  void store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n) override;
  void copy_kv_slots(const KvLayerView& kv, const int32_t* src, const int32_t* dst, int64_t n) override {
    inner_->copy_kv_slots(kv, src, dst, n);
  }
  void attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                 float* out) override;
  void prefetch_attention(const KvLayerView& kv, const AttentionBatch& batch) override;
  void silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) override;
  void silu_mul_matmul(const WeightMatrix& w, const float* gate, const float* up, int64_t in_stride, int64_t n,
                       float* act, float* y) override;
  void add(float* x, const float* y, int64_t n) override;
  void add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim,
                    float eps) override;
  void rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots,
                      int64_t n, int64_t n_heads, const RopeParams& p, float* q_out) override;
  void scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n, int64_t width,
                        float* dst) override;
  void expert_mlps(std::span<const ExpertMlp> experts, const float* x, float* y) override;
  bool routes_on_device(const MoeRouting& routing) const override { return inner_->routes_on_device(routing); }
  void group_by_expert(const MoeRouting& routing, const float* logits, const float* bias, int64_t n,
                       const int32_t* real_tokens, int32_t* rows, float* weights, int32_t* offsets) override;
  void expert_mlps_grouped(std::span<const ExpertWeights> experts, const int32_t* offsets, int64_t rows, const float* x,
                           float* y) override;
  void head_matmul(const WeightMatrix& w, int64_t n_heads, const float* x, HeadStrides x_strides, int64_t n, float* y,
                   HeadStrides y_strides) override;
  void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t n, int64_t width) override;
  void store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width, const float* rope_key,
                    const int32_t* slots, int64_t n) override;
  void attention_latent(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                        int64_t v_dim, float scale, float* out) override;
  bool fill_random(void* dst, DType type, int64_t n, uint64_t seed, float mean, float std) override {
    return inner_->fill_random(dst, type, n, seed, mean, std);
  }
  bool device_sampling() const override { return inner_->device_sampling(); }
  void sample(const float* logits, int64_t n, int64_t vocab, std::span<const SampleRow> rows, int32_t* tokens) override;
  // Graph replays would hide the ops inside them: a profiled engine runs its steps eagerly.
  bool begin_capture() override { return false; }
  void synchronize() override { inner_->synchronize(); }

 private:
  struct OpTotals {
    int64_t calls = 0;
    int64_t tokens = 0;
    double seconds = 0.0;
    void add(int64_t n, double s) {
      ++calls;
      tokens += n;
      seconds += s;
    }
  };
  // An op's totals, and the same split by the size class of its calls' token counts (calls with tokens only).
  struct OpStats {
    OpTotals all;
    OpTotals by_size[kTokensPerCallClasses];
  };
  // Runs fn, synchronizes, and charges the wall time to `op` (n tokens).
  template <class F>
  void timed(const std::string& op, int64_t n, F&& fn);

  std::unique_ptr<Backend> inner_;
  std::string destination_;
  int instance_ = 0;
  mutable std::mutex mutex_;
  std::map<std::string, OpStats> ops_;
};

}  // namespace servetune
