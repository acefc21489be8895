// The GPU backend (CUDA; HIP through gpu_shim.h): device buffers, one non-blocking stream, the kernels of kernels.h,
// and GEMMs through cuBLAS (bf16 weights x bf16-cast activations, f32 accumulate; f32 weights in plain fp32, no TF32).
// RMSNorm and SwiGLU write their outputs' bf16 copy too, which the next GEMM of exactly those outputs reads uncast.
// The HIP build has no BLAS library (Debian packages none) and uses the tiled kernel of gemm.cu; SERVETUNE_GPU_GEMM=tiled
// makes a CUDA build use it too (so the HIP build's GEMM is tested and timed where a GPU is).
// Block-scaled FP8 weights (DeepSeek-V3/R1's) stay FP8 on an sm_90 CUDA device, multiplied by cuBLASLt's FP8 GEMM
// (fp8_gemm.h); everywhere else (HIP, other GPUs, the tiled GEMM, shapes that GEMM cannot take) they become bf16 at load.
// Small host copies go through pinned memory (a staging ring for uploads, so they never wait for the stream).
// Kernel faults are asynchronous: they surface at the next synchronizing call, under that call's name. With
// SERVETUNE_GPU_SYNC_CHECK=1 (or CUDA_LAUNCH_BLOCKING=1) every op waits for its work and names itself in the error.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/expert_gemm.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/gpu_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_kernels.h"
#include "backend/cuda/prefill_attention_mma.h"
#include "backend/cuda/staging_ring.h"
#include "backend/fp8_layout.h"
#include "core/error.h"

#if !defined(SERVETUNE_HIP)
#include <cublas_v2.h>
#endif

namespace servetune {
namespace gpu {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorKind::kInternal, std::string(SERVETUNE_GPU_VENDOR " error in ") + what + ": " + cudaGetErrorString(status));
  }
}

bool sync_check_enabled() {
  static const bool enabled = [] {
    for (const char* name : {"SERVETUNE_GPU_SYNC_CHECK", "CUDA_LAUNCH_BLOCKING"}) {
      const char* v = std::getenv(name);
      if (v != nullptr && v[0] != '\0' && std::string(v) != "0") return true;
    }
    return false;
  }();
  return enabled;
}

namespace {

// Whether environment variable `name` is set to `value` (the backend's A/B switches).
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

// Device 0's SM count, queried once (it sizes the split-attention plan).
int64_t sm_count() {
  static const int64_t count = [] {
    int n = 0;
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
    return static_cast<int64_t>(n);
  }();
  return count;
}

// check() for a call that waits on the stream: without the sync check, the fault it reports may be any earlier op's.
void check_wait(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::string message = std::string(SERVETUNE_GPU_VENDOR " error in ") + what + ": " + cudaGetErrorString(status);
  if (!sync_check_enabled()) {
    message += " (kernels run asynchronously, so an earlier op may have caused it: rerun with SERVETUNE_GPU_SYNC_CHECK=1 "
               "to name the op)";
  }
  throw Error(ErrorKind::kInternal, message);
}

#if !defined(SERVETUNE_HIP)
void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorKind::kInternal, std::string("cuBLAS error in ") + what + ": status " + std::to_string(static_cast<int>(status)));
  }
}
#endif

class DeviceBuffer final : public Buffer {
 public:
  explicit DeviceBuffer(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    const cudaError_t status = cudaMalloc(&data_, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the failed allocation's error
      throw Error(ErrorKind::kUsage, "out of GPU memory allocating " + std::to_string(bytes >> 20) +
                                         " MiB (lower mem_fraction_static or max_total_tokens, or use a smaller model)");
    }
    check(status, "cudaMalloc");  // anything else (a graph capture in progress, a broken context) is not a memory shortage
  }
  ~DeviceBuffer() override {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_;
};

class GpuBackend final : public Backend {
 public:
  GpuBackend() {
    check(cudaSetDevice(0), "cudaSetDevice");
    // Non-blocking: no implicit ordering with the legacy default stream, which this backend never uses (every launch,
    // copy and cuBLAS call names stream_), so another thread's legacy-stream work cannot invalidate a graph capture.
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
#if !defined(SERVETUNE_HIP)
    check_blas(cublasCreate(&blas_), "cublasCreate");
    check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    // A fixed workspace, so cuBLAS allocates nothing while a graph is being captured.
    blas_workspace_ = std::make_unique<DeviceBuffer>(kBlasWorkspaceBytes);
    check_blas(cublasSetWorkspace(blas_, blas_workspace_->data(), kBlasWorkspaceBytes), "cublasSetWorkspace");
    // FP8 weights are kept as such only where the FP8 GEMM runs; the tiled kernel reads f32 and bf16 only.
    if (!tiled_gemm_ && fp8_block_gemm_supported()) fp8_ = std::make_unique<Fp8Gemm>();
#endif
  }
  ~GpuBackend() override {
    (void)cudaStreamSynchronize(stream_);
    staging_ring_.release_all([&](void* event) { free_events_.push_back(static_cast<cudaEvent_t>(event)); });
    for (cudaEvent_t event : free_events_) (void)cudaEventDestroy(event);
    if (staging_ != nullptr) (void)cudaFreeHost(staging_);
    if (readback_ != nullptr) (void)cudaFreeHost(readback_);
    drop_graphs();
#if !defined(SERVETUNE_HIP)
    cublasDestroy(blas_);
#endif
    (void)cudaStreamDestroy(stream_);
  }
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;

  std::string name() const override { return SERVETUNE_GPU_VENDOR; }
  DType matrix_storage_type(DType file_type) const override {
#if !defined(SERVETUNE_HIP)
    if (file_type == DType::kFP8_E4M3_B128 && fp8_) return file_type;
#endif
    return file_type == DType::kF32 || file_type == DType::kBF16 ? file_type : DType::kBF16;
  }
  // The FP8 GEMM's shape rules (fp8_gemm_shape_problem), and an algorithm from cuBLASLt's heuristic for the shape (so
  // a shape this cuBLASLt cannot run, partial 128-blocks say, costs bf16 weights rather than a failed step; said once
  // per shape on stderr). A matrix outside them is converted to bf16 at load.
  bool keeps_block_scaled(int64_t rows, int64_t cols, int64_t row_offset) const override {
    if (!fp8_gemm_shape_problem(rows, cols, row_offset).empty()) return false;
#if !defined(SERVETUNE_HIP)
    if (fp8_) {
      const std::string problem = fp8_->unsupported_reason(rows, cols, blas_workspace_->data(), kBlasWorkspaceBytes);
      if (!problem.empty()) {
        if (fp8_reported_.insert({rows, cols}).second) {
          std::fprintf(stderr, "servetune: FP8 weights of shape [%lld, %lld] are kept as bf16 on this GPU: %s\n",
                       static_cast<long long>(rows), static_cast<long long>(cols), problem.c_str());
        }
        return false;
      }
    }
#endif
    return true;
  }
  bool supports_kv_dtype(DType t) const override {
    return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kFP8_E4M3;
  }
  // attention, the split kernel and attention_latent honour draft-tree masks (tree_mask.h); copy_kv_slots below.
  bool supports_tree_attention() const override { return true; }
  std::optional<DeviceMemory> device_memory() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return DeviceMemory{static_cast<int64_t>(total), static_cast<int64_t>(free)};
  }

  std::unique_ptr<Buffer> allocate(size_t bytes) override { return std::make_unique<DeviceBuffer>(bytes); }
  // Copies of up to kStagedCopyBytes go through pinned host memory: an upload is copied into the staging ring and
  // sent by DMA without waiting for the stream (a copy from pageable memory may wait for the work queued before it,
  // which would stall the host behind the GPU at every step's index upload); a download lands in a pinned buffer.
  // Larger copies (weights at load, big logits tables) and copies while a graph is captured go direct.
  void upload(Buffer& dst, size_t offset, const void* src, size_t bytes) override {
    if (offset + bytes > dst.size()) throw Error(ErrorKind::kInternal, "GPU upload past the end of its buffer");
    void* target = static_cast<uint8_t*>(dst.data()) + offset;
    if (bytes > 0 && bytes <= kStagedCopyBytes && !capturing_ && pinned(staging_, kStagingBytes)) {
      const size_t at = staging_ring_.reserve(bytes, [&](void* event) {
        check_wait(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "upload");
        free_events_.push_back(static_cast<cudaEvent_t>(event));
      });
      std::memcpy(staging_ + at, src, bytes);
      check(cudaMemcpyAsync(target, staging_ + at, bytes, cudaMemcpyHostToDevice, stream_), "upload");
      cudaEvent_t event = nullptr;
      if (free_events_.empty()) {
        check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      } else {
        event = free_events_.back();
        free_events_.pop_back();
      }
      check(cudaEventRecord(event, stream_), "upload");
      staging_ring_.hold(at, bytes, event);
    } else {
      // From pageable memory the copy returns once the source is staged, so the caller may reuse it at once.
      check(cudaMemcpyAsync(target, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    }
    after("upload");
  }
  void download(void* dst, const Buffer& src, size_t offset, size_t bytes) override {
    if (offset + bytes > src.size()) throw Error(ErrorKind::kInternal, "GPU download past the end of its buffer");
    const void* from = static_cast<const uint8_t*>(const_cast<Buffer&>(src).data()) + offset;
    const bool staged = bytes > 0 && bytes <= kStagedCopyBytes && pinned(readback_, kStagedCopyBytes);
    check(cudaMemcpyAsync(staged ? readback_ : dst, from, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    wait_stream("download");
    if (staged) std::memcpy(dst, readback_, bytes);
  }
  void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) override {
    require_float_type(table, "embedding table");
    launch_embed(table, ids, n, out, stream_);
    after("embed");
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) override {
    uint16_t* copy = bf16_copy_buffer(n * dim);
    launch_rms_norm(const_cast<float*>(x), nullptr, w, y, n, dim, eps, stream_, copy);
    after("rms_norm");
    if (copy != nullptr) bf16_copy_ = {y, n * dim};
  }
  void matmul(const WeightMatrix& w, const float* bias, const float* x, int64_t n, float* y) override {
    const Bf16Copy kept = bf16_copy_;
    if (n > 0 && w.rows > 0) gemm(w, x, n, y);
    if (bias != nullptr) launch_add_bias(y, bias, n, w.rows, stream_);
    after("matmul");
    // The copy of x still holds unless the output overwrote x (matmuls of one input: Q, K, V; gate, up).
    const auto* end = y + n * w.rows;
    if (kept.src != nullptr && (end <= kept.src || y >= kept.src + kept.count)) bf16_copy_ = kept;
  }
  void rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) override {
    launch_rope(x, positions, n, n_heads, p, theta_scale(p), p.freq_factors, stream_);
    after("rope");
  }
  void store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n) override {
    require_kv_type(kv);
    launch_store_kv(kv, k, v, slots, n, stream_);
    after("store_kv");
  }
  void copy_kv_slots(const KvLayerView& kv, const int32_t* src, const int32_t* dst, int64_t n) override {
    require_kv_type(kv);
    launch_copy_kv_slots(kv, src, dst, n, stream_);
    after("copy_kv_slots");
  }
  void attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                 float* out) override {
    require_kv_type(kv);
    // Tensor cores for prefill-sized batches, unless SERVETUNE_GPU_ATTENTION=simt asks for the CUDA-core kernels (to
    // compare the two on a device, or to step around the newer kernel).
    if (!simt_attention_ && prefill_attention_mma_applies(kv, batch, n_heads, q, out)) {
      void* tiles = grow(attention_plan_, prefill_attention_mma_plan_bytes(batch.n_tokens), "attention");
      launch_prefill_attention_mma(kv, batch, q, n_heads, scale, tiles, out, stream_);
      after("attention");
      return;
    }
    const SplitPlan plan = plan_attention_split(kv, batch, n_heads, sm_count());
    if (plan.n_chunks > 1) {
      const size_t floats = split_attention_scratch_floats(plan, batch.n_tokens, n_heads, kv.head_dim);
      auto* partials = static_cast<float*>(grow(attention_partials_, floats * sizeof(float), "attention"));
      launch_attention_split(kv, batch, q, n_heads, scale, plan, partials, out, stream_);
    } else {
      launch_attention(kv, batch, q, n_heads, scale, out, stream_);
    }
    after("attention");
  }
  void silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) override {
    uint16_t* copy = bf16_copy_buffer(n * ffn);
    launch_silu_mul(gate, up, in_stride, n, ffn, out, stream_, copy);
    after("silu_mul");
    if (copy != nullptr) bf16_copy_ = {out, n * ffn};
  }
  void add(float* x, const float* y, int64_t n) override {
    launch_add(x, y, n, stream_);
    after("add");
  }
  void add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps) override {
    uint16_t* copy = bf16_copy_buffer(n * dim);
    launch_rms_norm(x, residual, w, y, n, dim, eps, stream_, copy);
    after("add_rms_norm");
    if (copy != nullptr) bf16_copy_ = {y, n * dim};
  }
  void rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots, int64_t n,
                      int64_t n_heads, const RopeParams& p, float* q_out) override {
    require_kv_type(kv);
    launch_rope_store_qkv(kv, qkv, positions, slots, n, n_heads, p, theta_scale(p), q_out, stream_);
    after("rope_store_qkv");
  }
  // Mixture-of-experts and latent attention (moe.cu, latent.cu). Index arrays (rows, slots) are device memory, as
  // store_kv's slots are.
  void scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n, int64_t width,
                        float* dst) override {
    launch_scatter_add_rows(src, rows, weights, n, width, dst, stream_);
    after("scatter_add_rows");
  }
  void expert_mlps(std::span<const ExpertMlp> experts, const float* x, float* y) override {
    // Each expert's rows are contiguous (the permuted layout of vLLM's fused MoE). bf16 and FP8 experts take the
    // grouped kernel (expert_gemm.cu: two launches for all experts); otherwise, and with SERVETUNE_GPU_MOE=loop (to
    // compare the two on a device) or the tiled GEMM, one GEMM per projection and expert.
    int64_t most = 0;
    for (const ExpertMlp& e : experts) {
      if (e.count <= 0) continue;
      if (e.up->rows != e.gate->rows || e.up->cols != e.gate->cols || e.down->cols != e.gate->rows) {
        throw Error(ErrorKind::kInternal, "expert_mlps: gate, up and down shapes do not chain");
      }
      most = std::max(most, e.count * e.gate->rows);
    }
    if (most == 0) return;
#if !defined(SERVETUNE_HIP)
    // One MLP (a dense layer, a shared expert) is three cuBLAS GEMMs, which a graph can capture; the grouped kernel
    // needs its plan uploaded.
    const auto active = std::count_if(experts.begin(), experts.end(), [](const ExpertMlp& e) { return e.count > 0; });
    if (active > 1 && grouped_kernel_on() && grouped_expert_problem(experts, x, y).empty()) {
      grouped_expert_mlps(experts, x, y);
      after("expert_mlps");
      return;
    }
#endif
    auto* gate = static_cast<float*>(grow(mlp_gate_, static_cast<size_t>(most) * sizeof(float), "expert MLP"));
    auto* up = static_cast<float*>(grow(mlp_up_, static_cast<size_t>(most) * sizeof(float), "expert MLP"));
    for (const ExpertMlp& e : experts) {
      if (e.count <= 0) continue;
      const int64_t width = e.gate->rows;
      const float* rows = x + e.first * e.gate->cols;
      gemm(*e.gate, rows, e.count, gate);
      gemm(*e.up, rows, e.count, up);
      launch_silu_mul(gate, up, width, e.count, width, gate, stream_);
      gemm(*e.down, gate, e.count, y + e.first * e.down->rows);
    }
    after("expert_mlps");
  }
  // Routing on the device: the routing kernels of expert_routing.cu, then (expert_mlps_grouped) a tile plan made on
  // the device from the offsets and the grouped kernel over it. CUDA with the grouped kernel only: the HIP build,
  // SERVETUNE_GPU_GEMM=tiled and SERVETUNE_GPU_MOE=loop route on the host.
  bool routes_on_device(const MoeRouting& r) const override {
#if defined(SERVETUNE_HIP)
    (void)r;
    return false;
#else
    return grouped_kernel_on() && r.n_experts <= kMaxRoutedExperts && r.n_group <= kMaxRoutedGroups &&
           r.topk_group <= kMaxRoutedGroups;
#endif
  }
  void group_by_expert(const MoeRouting& r, const float* logits, const float* bias, int64_t n, const int32_t* real_tokens,
                       int32_t* rows, float* weights, int32_t* offsets) override {
    if (!routes_on_device(r)) throw Error(ErrorKind::kInternal, "group_by_expert: this backend routes on the host");
    validate_moe_routing(r, "group_by_expert");
    const int64_t count = n * r.top_k;
    auto* ids = static_cast<int32_t*>(grow(routed_ids_, static_cast<size_t>(std::max<int64_t>(count, 1)) * 4, "routing"));
    auto* chosen = static_cast<float*>(grow(routed_weights_, static_cast<size_t>(std::max<int64_t>(count, 1)) * 4, "routing"));
    launch_route_experts(r, logits, bias, n, ids, chosen, stream_);
    launch_group_by_expert(ids, chosen, n, real_tokens, r.top_k, r.n_experts, rows, weights, offsets, stream_);
    after("group_by_expert");
  }
  void expert_mlps_grouped(std::span<const ExpertWeights> experts, const int32_t* offsets, int64_t rows, const float* x,
                           float* y) override {
    if (rows <= 0 || experts.empty()) return;
    probe_experts_.clear();
    for (const ExpertWeights& e : experts) probe_experts_.push_back({e.gate, e.up, e.down, 0, 1});
#if !defined(SERVETUNE_HIP)
    if (grouped_kernel_on() && grouped_expert_problem(probe_experts_, x, y).empty()) {
      const auto n = static_cast<int64_t>(experts.size());
      const int tile_rows = expert_tile_rows(rows, n);  // over every expert: the counts are on the device
      const int64_t max_tiles = rows / tile_rows + n;  // each expert adds at most one partial tile
      auto* plan = static_cast<uint8_t*>(grow(moe_device_plan_, 16 + static_cast<size_t>(max_tiles) * sizeof(ExpertTile),
                                              "expert GEMM plan"));
      auto* tile_count = reinterpret_cast<int32_t*>(plan);
      auto* tiles = reinterpret_cast<ExpertTile*>(plan + 16);
      launch_plan_expert_tiles(offsets, n, tile_rows, tile_count, tiles, stream_);
      const ExpertWeightRef* refs = layer_refs(experts);
      launch_grouped_mlps(tiles, max_tiles, tile_count, tile_rows, refs, experts.size(), *experts[0].gate,
                          *experts[0].down, rows, x, y);
      after("expert_mlps_grouped");
      return;
    }
#endif
    // Experts the grouped kernel cannot take (f32 weights, odd shapes): their runs come to the host, one GEMM each.
    if (capturing_) {
      throw_unsupported("compile = graphs: these experts (" + std::string(dtype_name(experts[0].gate->type)) +
                        ") need their runs on the host, which a graph cannot do; the grouped kernel takes bf16 and FP8 "
                        "experts with input widths a multiple of 16 (use compile = fused)");
    }
    std::vector<int32_t> host_offsets(experts.size() + 1);
    check(cudaMemcpyAsync(host_offsets.data(), offsets, host_offsets.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                          stream_),
          "expert_mlps_grouped");
    wait_stream("expert_mlps_grouped");
    for (size_t e = 0; e < experts.size(); ++e) {
      probe_experts_[e].first = host_offsets[e];
      probe_experts_[e].count = host_offsets[e + 1] - host_offsets[e];
    }
    expert_mlps(probe_experts_, x, y);
  }
  void head_matmul(const WeightMatrix& w, int64_t n_heads, const float* x, HeadStrides x_strides, int64_t n, float* y,
                   HeadStrides y_strides) override {
    if (n_heads <= 0 || w.rows % n_heads != 0) throw Error(ErrorKind::kInternal, "head_matmul: rows not a multiple of heads");
    if (n > 0 && w.rows > 0) head_gemm(w, w.rows / n_heads, n_heads, x, x_strides, n, y, y_strides);
    after("head_matmul");
  }
  void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t n, int64_t width) override {
    if (n > 0 && width > 0) {
      const size_t bytes = static_cast<size_t>(width) * sizeof(float);
      // One row's pitch is never used; the runtime still wants pitches of at least a row.
      const auto pitch = [&](int64_t stride) { return n == 1 ? bytes : static_cast<size_t>(stride) * sizeof(float); };
      if (n > 1 && (src_stride < width || dst_stride < width)) throw Error(ErrorKind::kInternal, "copy_rows: rows overlap");
      check(cudaMemcpy2DAsync(dst, pitch(dst_stride), src, pitch(src_stride), bytes, static_cast<size_t>(n),
                              cudaMemcpyDeviceToDevice, stream_),
            "copy_rows");
    }
    after("copy_rows");
  }
  void store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width, const float* rope_key,
                    const int32_t* slots, int64_t n) override {
    require_latent_view(kv);
    if (latent_width < 0 || latent_width > kv.head_dim) throw Error(ErrorKind::kInternal, "store_latent: latent wider than the row");
    launch_store_latent(kv, latent, latent_width, rope_key, slots, n, stream_);
    after("store_latent");
  }
  void attention_latent(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, int64_t v_dim,
                        float scale, float* out) override {
    require_latent_view(kv);
    if (v_dim > kv.head_dim) throw Error(ErrorKind::kInternal, "attention_latent: v_dim above the row width");
    const int64_t floats = attention_latent_scratch_floats(kv, batch, n_heads, v_dim);
    float* partials = floats == 0 ? nullptr
                                  : static_cast<float*>(grow(latent_partials_, static_cast<size_t>(floats) * sizeof(float),
                                                             "attention_latent"));
    launch_attention_latent(kv, batch, q, n_heads, v_dim, scale, out, partials, stream_);
    after("attention_latent");
  }
  bool fill_random(void* dst, DType type, int64_t n, uint64_t seed, float mean, float std) override {
    if (type != DType::kF32 && type != DType::kBF16) return false;
    launch_fill_random(dst, type == DType::kBF16, n, seed, mean, std, stream_);
    after("fill_random");
    return true;
  }
  bool device_sampling() const override { return true; }
  void sample(const float* logits, int64_t n, int64_t vocab, std::span<const SampleRow> rows, int32_t* tokens) override {
    if (static_cast<int64_t>(rows.size()) != n) throw Error(ErrorKind::kInternal, "GPU sample: one SampleRow per logits row");
    for (const SampleRow& r : rows) check_sample_row(r);
    if (n == 0) return;
    const size_t row_bytes = static_cast<size_t>(n) * sizeof(SampleRow), token_bytes = static_cast<size_t>(n) * sizeof(int32_t);
    if (!sample_rows_ || sample_rows_->size() < row_bytes) sample_rows_ = std::make_unique<DeviceBuffer>(2 * row_bytes);
    if (!sample_tokens_ || sample_tokens_->size() < token_bytes) sample_tokens_ = std::make_unique<DeviceBuffer>(2 * token_bytes);
    upload(*sample_rows_, 0, rows.data(), row_bytes);
    launch_sample(logits, n, vocab, static_cast<const SampleRow*>(sample_rows_->data()),
                  static_cast<int32_t*>(sample_tokens_->data()), stream_);
    after("sample");
    download(tokens, *sample_tokens_, 0, token_bytes);
    for (int64_t i = 0; i < n; ++i) {
      if (tokens[i] < 0) {
        throw Error(ErrorKind::kInternal, "GPU sample: logits row " + std::to_string(i) +
                                              " holds NaN or +inf (the forward pass produced non-finite values)");
      }
    }
  }
  bool begin_capture() override {
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    capturing_ = true;
    return true;
  }
  void end_capture(int64_t key) override {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    capturing_ = false;
    if (key < 0) {  // discarding, usually after a failure inside the capture: that error is the one to report
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      return;
    }
    check(ended, "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
#if defined(SERVETUNE_HIP)
    const cudaError_t status = hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0);
#else
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0ULL);
#endif
    (void)cudaGraphDestroy(graph);
    check(status, "cudaGraphInstantiate");
    if (auto it = graphs_.find(key); it != graphs_.end()) (void)cudaGraphExecDestroy(it->second);
    graphs_[key] = exec;
  }
  void replay_graph(int64_t key) override {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) throw Error(ErrorKind::kInternal, "no captured graph " + std::to_string(key));
    check(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
    after("graph replay");
  }
  void drop_graphs() override {
    for (auto& [key, exec] : graphs_) (void)cudaGraphExecDestroy(exec);
    graphs_.clear();
    retired_.clear();
  }
  void synchronize() override { wait_stream("cudaStreamSynchronize"); }

 private:
  // The sync check (see the file comment): waits for the op's work, so a fault is reported against `op`. Nothing runs
  // while a graph is being captured (and a capturing stream cannot be synchronized), so captures are not checked; the
  // replay is, as a whole.
  void after(const char* op) {
    bf16_copy_ = {};  // the op may have written the copied values (matmul and the producers keep or set it after this)
    if (!sync_check_ || capturing_) return;
    const cudaError_t status = cudaStreamSynchronize(stream_);
    if (status != cudaSuccess) {
      throw Error(ErrorKind::kInternal, std::string(SERVETUNE_GPU_VENDOR " fault in op ") + op + " (sync check): " +
                                            cudaGetErrorString(status));
    }
  }
  // Whether the grouped expert kernel (and with it routing on the device) runs: not under SERVETUNE_GPU_MOE=loop or
  // the tiled GEMM (CUDA builds; HIP has none).
  bool grouped_kernel_on() const {
#if defined(SERVETUNE_HIP)
    return false;
#else
    return !tiled_gemm_ && !loop_moe_;
#endif
  }
  // Waits for the stream's work (an error names `what`); every staged upload has then been read.
  void wait_stream(const char* what) {
    check_wait(cudaStreamSynchronize(stream_), what);
    staging_ring_.release_all([&](void* event) { free_events_.push_back(static_cast<cudaEvent_t>(event)); });
  }
  // Whether `buffer` holds `bytes` of pinned host memory, allocating it on first use; false (and direct copies from
  // then on) where the system refuses to pin that much.
  bool pinned(uint8_t*& buffer, size_t bytes) {
    if (buffer != nullptr) return true;
    if (pinning_refused_) return false;
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      pinning_refused_ = true;
      return false;
    }
    buffer = static_cast<uint8_t*>(p);
    return true;
  }
  // Where a producer op (rms_norm, add_rms_norm, silu_mul) writes the bf16 copy of its `count` outputs, which the
  // cuBLAS bf16 GEMM reading exactly those outputs next takes instead of casting them (one kernel and one pass over
  // the activations fewer per GEMM input). Null where nothing reads it: the tiled GEMM (and HIP) casts on the fly.
  uint16_t* bf16_copy_buffer(int64_t count) {
#if defined(SERVETUNE_HIP)
    (void)count;
    return nullptr;
#else
    if (tiled_gemm_ || count <= 0) return nullptr;
    return static_cast<uint16_t*>(grow(bf16_copy_buffer_, static_cast<size_t>(count) * sizeof(uint16_t), "bf16 copy"));
#endif
  }
  void require_latent_view(const KvLayerView& kv) const {
    if (kv.n_kv_heads != 1 || kv.k == nullptr) throw Error(ErrorKind::kInternal, "latent cache view needs one head");
    require_kv_type(kv);
  }
  // `buffer` holding at least `bytes` (grown to twice that when short). An allocation cannot be recorded into a
  // graph, and a buffer a captured graph uses must stay alive: growing is refused while capturing, and a replaced
  // buffer is kept while graphs exist.
  void* grow(std::unique_ptr<DeviceBuffer>& buffer, size_t bytes, const char* what) {
    if (!buffer || buffer->size() < bytes) {
      if (capturing_) {
        throw Error(ErrorKind::kInternal, std::string("GPU ") + what + " scratch must grow during a graph capture (the "
                                          "eager warm-up step of that batch size should have sized it)");
      }
      if (buffer && !graphs_.empty()) retired_.push_back(std::move(buffer));  // captured graphs still use it
      buffer = std::make_unique<DeviceBuffer>(bytes * 2);
    }
    return buffer->data();
  }
  void require_kv_type(const KvLayerView& kv) const {
    if (!supports_kv_dtype(kv.dtype)) {
      throw Error(ErrorKind::kInternal,
                  "GPU KV cache must be f32, f16, bf16 or fp8_e4m3, got " + std::string(dtype_name(kv.dtype)));
    }
  }
  // As the CPU reference computes it (host std::pow), so both backends start from the same float.
  static float theta_scale(const RopeParams& p) { return std::pow(p.theta, -2.0f / static_cast<float>(p.rope_dim)); }
  // The device sampler draws what SampleRow can say; anything outside the host Sampler's valid ranges is refused.
  static void check_sample_row(const SampleRow& r) {
    if (const std::string problem = sample_row_problem(r); !problem.empty()) {
      throw Error(ErrorKind::kInternal, "GPU sample: " + problem);
    }
  }
  static void require_float_type(const WeightMatrix& w, const char* what) {
    if (w.type != DType::kF32 && w.type != DType::kF16 && w.type != DType::kBF16) {
      throw Error(ErrorKind::kInternal, std::string("GPU ") + what + " must be f32, f16 or bf16, got " + std::string(dtype_name(w.type)));
    }
  }

  void gemm(const WeightMatrix& w, const float* x, int64_t n, float* y) {
#if !defined(SERVETUNE_HIP)
    if (w.type == DType::kFP8_E4M3_B128 && fp8_) {
      fp8_gemm(w, x, n, y);
      return;
    }
#endif
    if (w.type != DType::kF32 && w.type != DType::kBF16) {
      throw Error(ErrorKind::kInternal, "GPU matmul needs f32 or bf16 weights, got " + std::string(dtype_name(w.type)));
    }
#if defined(SERVETUNE_HIP)
    launch_gemm_tiled(w, x, n, y, stream_);
#else
    if (tiled_gemm_) {
      launch_gemm_tiled(w, x, n, y, stream_);
      return;
    }
    const float alpha = 1.0f, beta = 0.0f;
    // Row-major y[n, rows] is column-major [rows, n] = W^T(col-major [cols, rows]) x (col-major [cols, n]).
    const int m = static_cast<int>(w.rows), nn = static_cast<int>(n), k = static_cast<int>(w.cols);
    if (w.type == DType::kF32) {
      check_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w.data, CUDA_R_32F,
                              static_cast<int>(w.row_bytes / 4), x, CUDA_R_32F, k, &beta, y, CUDA_R_32F, m,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "f32 GEMM");
      return;
    }
    const uint16_t* xb = nullptr;
    if (bf16_copy_.src == x && bf16_copy_.count == n * w.cols) {
      xb = static_cast<const uint16_t*>(bf16_copy_buffer_->data());  // the producer wrote it: no cast kernel
    } else {
      auto* cast = static_cast<uint16_t*>(grow(x_bf16_, static_cast<size_t>(n * w.cols) * sizeof(uint16_t), "GEMM"));
      launch_to_bf16(x, cast, n * w.cols, stream_);
      xb = cast;
    }
    check_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w.data, CUDA_R_16BF,
                            static_cast<int>(w.row_bytes / 2), xb, CUDA_R_16BF, k, &beta, y, CUDA_R_32F, m,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "bf16 GEMM");
#endif
  }

#if !defined(SERVETUNE_HIP)
  // y[n, rows] = x . W^T for block-scaled FP8 W: x quantized to e4m3 per token and 128 columns, then cuBLASLt. The
  // GEMM runs on a multiple of 4 tokens and writes 256-byte-aligned output (the heuristic's default alignment
  // assumption), so a y that is neither gets the result through a scratch copy.
  void fp8_gemm(const WeightMatrix& w, const float* x, int64_t n, float* y) {
    const int64_t n_pad = fp8_gemm_tokens(n);
    auto* codes = static_cast<uint8_t*>(grow(x_fp8_, static_cast<size_t>(n_pad * w.cols), "FP8 GEMM"));
    auto* scales = static_cast<float*>(
        grow(x_fp8_scales_, static_cast<size_t>(fp8_blocks(w.cols) * n_pad) * sizeof(float), "FP8 GEMM"));
    launch_quantize_fp8_groups(x, n, w.cols, codes, scales, stream_);
    const bool direct = n_pad == n && reinterpret_cast<uintptr_t>(y) % 256 == 0;
    float* out = direct ? y
                        : static_cast<float*>(grow(fp8_out_, static_cast<size_t>(n_pad * w.rows) * sizeof(float), "FP8 GEMM"));
    fp8_->run(w, codes, scales, n_pad, out, blas_workspace_->data(), kBlasWorkspaceBytes, stream_);
    if (!direct) {
      check(cudaMemcpyAsync(y, out, static_cast<size_t>(n * w.rows) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
            "FP8 GEMM output copy");
    }
  }
#endif

  // expert_mlps through the grouped kernel: the tile plan and the experts' gate, up and down references go up in one
  // copy; then one SwiGLU launch (gate and up) into act rows, and one launch of the downs.
  void grouped_expert_mlps(std::span<const ExpertMlp> experts, const float* x, float* y) {
    const int tile_rows = expert_tile_rows(experts);
    plan_expert_tiles(experts, tile_rows, moe_tiles_);
    const ExpertMlp* model = nullptr;  // an active entry: every active one has its types and shapes
    int64_t rows = 0;
    for (const ExpertMlp& e : experts) {
      if (e.count <= 0) continue;
      model = &e;
      rows = std::max(rows, e.first + e.count);
    }
    // The tiles, then the references 16-byte aligned, in one upload.
    const size_t tile_bytes = moe_tiles_.size() * sizeof(ExpertTile), refs_offset = (tile_bytes + 15) / 16 * 16;
    moe_plan_host_.resize(refs_offset + 3 * experts.size() * sizeof(ExpertWeightRef));
    std::memcpy(moe_plan_host_.data(), moe_tiles_.data(), tile_bytes);
    write_expert_refs(experts, reinterpret_cast<ExpertWeightRef*>(moe_plan_host_.data() + refs_offset));
    grow(moe_plan_, moe_plan_host_.size(), "expert GEMM plan");
    upload(*moe_plan_, 0, moe_plan_host_.data(), moe_plan_host_.size());
    const auto* plan = static_cast<const uint8_t*>(moe_plan_->data());
    launch_grouped_mlps(reinterpret_cast<const ExpertTile*>(plan), static_cast<int64_t>(moe_tiles_.size()), nullptr,
                        tile_rows, reinterpret_cast<const ExpertWeightRef*>(plan + refs_offset), experts.size(),
                        *model->gate, *model->down, rows, x, y);
  }

#if !defined(SERVETUNE_HIP)
  // The experts' gate, up and down references (3 x n) in device memory, uploaded once per set of experts (a layer's):
  // kept by the first gate's address and re-uploaded only when the references differ, so a captured graph's step
  // uploads nothing. The host copy is compared each call (a few KB), as another model may reuse an address.
  const ExpertWeightRef* layer_refs(std::span<const ExpertWeights> experts) {
    refs_host_.resize(3 * experts.size());
    write_expert_refs(experts, refs_host_.data());
    LayerRefs& cached = layer_refs_[experts[0].gate];
    const size_t bytes = refs_host_.size() * sizeof(ExpertWeightRef);
    if (cached.host.size() != refs_host_.size() ||
        std::memcmp(cached.host.data(), refs_host_.data(), bytes) != 0) {
      if (capturing_) {
        throw Error(ErrorKind::kInternal, "expert references must be uploaded during a graph capture (the eager "
                                          "warm-up step of that batch size should have uploaded them)");
      }
      if (cached.device && !graphs_.empty()) retired_.push_back(std::move(cached.device));  // graphs still read it
      if (!cached.device || cached.device->size() < bytes) cached.device = std::make_unique<DeviceBuffer>(bytes);
      upload(*cached.device, 0, refs_host_.data(), bytes);
      cached.host = refs_host_;
    }
    return static_cast<const ExpertWeightRef*>(cached.device->data());
  }
#endif

  // The grouped MLPs over a tile plan: gate and up with SwiGLU into act rows (rows x gate.rows), then the downs into y.
  // `gate` and `down` stand for every expert's (grouped_expert_problem checked they agree).
  void launch_grouped_mlps(const ExpertTile* tiles, int64_t n_tiles, const int32_t* tile_count, int tile_rows,
                           const ExpertWeightRef* refs, size_t n, const WeightMatrix& gate, const WeightMatrix& down,
                           int64_t rows, const float* x, float* y) {
    auto* act = static_cast<float*>(grow(mlp_gate_, static_cast<size_t>(rows * gate.rows) * sizeof(float), "expert MLP"));
    launch_expert_gemm(tiles, n_tiles, tile_count, tile_rows, refs, refs + n, gate.type == DType::kFP8_E4M3_B128, x,
                       gate.cols, gate.rows, act, stream_);
    launch_expert_gemm(tiles, n_tiles, tile_count, tile_rows, refs + 2 * n, nullptr, down.type == DType::kFP8_E4M3_B128, act,
                       down.cols, down.rows, y, stream_);
  }

  // head_matmul's GEMMs: y_h = x_h . W_h^T for every head h in one strided batched call (the HIP build, and
  // SERVETUNE_GPU_GEMM=tiled: the batched tiled kernel). bf16 weights take the heads' inputs packed as bf16.
  void head_gemm(const WeightMatrix& w, int64_t rows, int64_t n_heads, const float* x, HeadStrides xs, int64_t n, float* y,
                 HeadStrides ys) {
    if (w.type != DType::kF32 && w.type != DType::kBF16) {
      throw Error(ErrorKind::kInternal, "GPU head_matmul needs f32 or bf16 weights, got " + std::string(dtype_name(w.type)));
    }
#if !defined(SERVETUNE_HIP)
    if (!tiled_gemm_) {
      const float alpha = 1.0f, beta = 0.0f;
      const int m = static_cast<int>(rows), nn = static_cast<int>(n), k = static_cast<int>(w.cols);
      // Leading dimensions of one column (n == 1) are never used, but cuBLAS checks them.
      const int64_t ldx = n == 1 ? std::max(xs.row, w.cols) : xs.row, ldy = n == 1 ? std::max(ys.row, rows) : ys.row;
      if (ldy < rows) throw Error(ErrorKind::kInternal, "head_matmul: output rows overlap");
      const int64_t elem = w.type == DType::kF32 ? 4 : 2, lda = w.row_bytes / elem;
      if (w.type == DType::kF32) {
        if (ldx < w.cols) throw Error(ErrorKind::kInternal, "head_matmul: input rows overlap");
        check_blas(cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w.data, CUDA_R_32F,
                                              static_cast<int>(lda), rows * lda, x, CUDA_R_32F, static_cast<int>(ldx),
                                              xs.head, &beta, y, CUDA_R_32F, static_cast<int>(ldy), ys.head,
                                              static_cast<int>(n_heads), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "f32 head GEMM");
        return;
      }
      auto* packed = static_cast<uint16_t*>(
          grow(x_bf16_, static_cast<size_t>(n_heads * n * w.cols) * sizeof(uint16_t), "GEMM"));
      launch_pack_heads_bf16(x, xs.row, xs.head, n, n_heads, w.cols, packed, stream_);
      check_blas(cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w.data, CUDA_R_16BF,
                                            static_cast<int>(lda), rows * lda, packed, CUDA_R_16BF, k, n * w.cols, &beta,
                                            y, CUDA_R_32F, static_cast<int>(ldy), ys.head, static_cast<int>(n_heads),
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "bf16 head GEMM");
      return;
    }
#endif
    launch_gemm_tiled_batched(w, rows, n_heads, x, xs.row, xs.head, n, y, ys.row, ys.head, stream_);
  }

  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;
  const bool sync_check_ = sync_check_enabled();
  const bool simt_attention_ = env_is("SERVETUNE_GPU_ATTENTION", "simt");
  const bool loop_moe_ = env_is("SERVETUNE_GPU_MOE", "loop");
  std::map<int64_t, cudaGraphExec_t> graphs_;
  static constexpr size_t kStagingBytes = size_t{16} << 20, kStagedCopyBytes = size_t{4} << 20;
  uint8_t* staging_ = nullptr;   // pinned: the upload ring's memory
  uint8_t* readback_ = nullptr;  // pinned: downloads of up to kStagedCopyBytes
  bool pinning_refused_ = false;
  StagingRing staging_ring_{kStagingBytes};
  std::vector<cudaEvent_t> free_events_;  // recorded after staged uploads, reused once their copy is done
#if !defined(SERVETUNE_HIP)
  // Read per backend, not once per process, so a test can make one of each.
  const bool tiled_gemm_ = env_is("SERVETUNE_GPU_GEMM", "tiled");
  static constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<DeviceBuffer> blas_workspace_;  // cuBLAS's, and cuBLASLt's for the FP8 GEMMs (same stream)
  std::unique_ptr<Fp8Gemm> fp8_;                  // sm_90 without the tiled GEMM only
  mutable std::set<std::pair<int64_t, int64_t>> fp8_reported_;  // shapes keeps_block_scaled said it turned to bf16
  std::unique_ptr<DeviceBuffer> x_fp8_, x_fp8_scales_, fp8_out_;  // FP8 GEMM activations, their scales, padded output
#endif
  std::unique_ptr<DeviceBuffer> sample_rows_, sample_tokens_;  // Backend::sample's rows in and ids out
  std::unique_ptr<DeviceBuffer> x_bf16_;  // activations cast to bf16 for the bf16 GEMMs
  // The last producer's outputs as bf16 (bf16_copy_buffer_), valid for [src, src + count) until another op runs.
  struct Bf16Copy {
    const float* src = nullptr;
    int64_t count = 0;
  };
  Bf16Copy bf16_copy_;
  std::unique_ptr<DeviceBuffer> bf16_copy_buffer_;
  std::unique_ptr<DeviceBuffer> mlp_gate_, mlp_up_;  // expert_mlps' gate and up rows (grouped: the SwiGLU rows)
  std::unique_ptr<DeviceBuffer> moe_plan_;            // the grouped expert GEMM's tiles and weight references
  std::unique_ptr<DeviceBuffer> moe_device_plan_;     // a tile plan made on the device (its count, then its tiles)
  std::unique_ptr<DeviceBuffer> routed_ids_, routed_weights_;  // group_by_expert's per-token choices
  std::vector<ExpertMlp> probe_experts_;
#if !defined(SERVETUNE_HIP)  // the grouped kernel is CUDA's (and Debian's hipcc crashes on this map's destructor)
  struct LayerRefs {
    std::vector<ExpertWeightRef> host;
    std::unique_ptr<DeviceBuffer> device;
  };
  std::map<const WeightMatrix*, LayerRefs> layer_refs_;  // expert_mlps_grouped's references per set of experts
  std::vector<ExpertWeightRef> refs_host_;
#endif
  std::vector<ExpertTile> moe_tiles_;
  std::vector<uint8_t> moe_plan_host_;
  std::unique_ptr<DeviceBuffer> latent_partials_;    // attention_latent's split partials
  std::unique_ptr<DeviceBuffer> attention_partials_;  // split attention's per-chunk partial softmaxes
  std::unique_ptr<DeviceBuffer> attention_plan_;      // the tensor-core prefill attention's tile plan
  std::vector<std::unique_ptr<DeviceBuffer>> retired_;  // earlier scratch buffers that captured graphs read
};

}  // namespace
}  // namespace gpu

const char* gpu_backend_name() { return SERVETUNE_GPU_VENDOR; }

int64_t gpu_attention_chunks(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads) {
  return gpu::plan_attention_split(kv, batch, n_heads, gpu::sm_count()).n_chunks;
}

bool gpu_attention_tensor_cores(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads) {
  return gpu::prefill_attention_mma_applies(kv, batch, n_heads, nullptr, nullptr);
}

int gpu_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_gpu_backend() {
  if (gpu_device_count() == 0) {
    throw_unsupported(std::string("device '") + SERVETUNE_GPU_VENDOR + "' was asked for, but no GPU is visible to the " +
                      SERVETUNE_GPU_VENDOR + " runtime on this machine");
  }
  return std::make_unique<gpu::GpuBackend>();
}

}  // namespace servetune
