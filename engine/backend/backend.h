// The op interface the model runs on: every backend (cpu, cuda, hip) implements these ops over buffers it owns.
// Activations are f32 row-major [n_tokens, width]; weights are MatrixViews in any supported dtype.
// The model calls only this interface, so the same layer code runs on every device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "backend/moe_routing.h"
#include "core/dtype.h"

namespace servetune {

class ThreadPool;

// A weight matrix with `rows` output features and `cols` input features; rows are contiguous in GGML block layout
// (row_bytes = dtype_row_bytes(type, cols)). Non-owning; lives in backend memory, as do the block scales that type
// kFP8_E4M3_B128 carries (no other type has any; its scale rows BlockScales::stride floats apart, a multiple of 4: see
// backend/fp8_layout.h). Only backends whose matrix_storage_type keeps kFP8_E4M3_B128 (the CPU; CUDA on sm_90, for
// the shapes keeps_block_scaled takes) ever see that type; for the others the loader dequantizes such weights to bf16.
struct WeightMatrix {
  const void* data = nullptr;
  DType type = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;
  BlockScales scales;
};

// Rotary embedding of the first `rope_dim` dims of each head. Normal (GGUF llama) rotates pairs (2i, 2i+1);
// NeoX (HF llama, qwen2) rotates (i, i + rope_dim/2). freq_factors (rope_dim/2 values, llama3 scaling) may be null.
struct RopeParams {
  int64_t head_dim = 0;
  int64_t rope_dim = 0;
  float theta = 10000.0f;
  float freq_scale = 1.0f;  // 1 / linear scaling factor
  bool neox = false;
  const float* freq_factors = nullptr;
};

// Paged KV cache geometry of one layer: K and V are [num_blocks, page_size, n_kv_heads, head_dim] in `dtype`, except
// that a backend may lay K out its own way within a block (the CPU transposes it: backend/cpu/kv_layout.h); only the
// backend's own store_kv / rope_store_qkv write a cache its attention reads.
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF32;
  int64_t num_blocks = 0;
  int64_t page_size = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// Which cached positions each token of a flattened batch attends to: token t belongs to sequence seq_of_token[t]
// and sees that sequence's positions [0, positions[t]] through its block table (causal).
// Draft trees (speculative verification, null tree_mask: none): a token with tree_mask[t] != 0 instead sees its
// sequence's cache indices [0, tree_base[t]) and, of tree_base[t] + i (i < 64), those whose bit i is set in
// tree_mask[t] (itself and its ancestors); its position (rotary) is its depth, not its cache index.
struct AttentionBatch {
  int64_t n_tokens = 0;
  const int32_t* positions = nullptr;     // [n_tokens]
  const int32_t* seq_of_token = nullptr;  // [n_tokens]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  const int32_t* tree_base = nullptr;     // [n_tokens] with tree_mask
  const uint64_t* tree_mask = nullptr;    // [n_tokens] or null
};

// Whether token t is a draft-tree token (AttentionBatch::tree_mask).
inline bool attention_tree_token(const AttentionBatch& b, int64_t t) { return b.tree_mask != nullptr && b.tree_mask[t] != 0; }
// The cache indices [0, n) token t's attention scans (every one it sees, and for a tree token the masked ones between).
inline int64_t attention_span(const AttentionBatch& b, int64_t t) {
  if (!attention_tree_token(b, t)) return b.positions[t] + 1;
  return b.tree_base[t] + 64 - __builtin_clzll(b.tree_mask[t]);
}
// Whether token t sees cache index j < attention_span(b, t).
inline bool attention_sees(const AttentionBatch& b, int64_t t, int64_t j) {
  if (!attention_tree_token(b, t) || j < b.tree_base[t]) return true;
  return ((b.tree_mask[t] >> (j - b.tree_base[t])) & 1u) != 0;
}

// One logits row's draw for Backend::sample, with the host Sampler's semantics (runtime/sampler.h): greedy (lowest id
// among tied maxima) when temperature is 0; otherwise temperature, then top-k, top-p and min-p over the tokens sorted
// by logit (ties by id), and `uniform` in [0, 1) (drawn by the request's RNG) times the kept mass picks the token.
struct SampleRow {
  float temperature = 0.0f;
  int32_t top_k = 0;  // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  double uniform = 0.0;
};

// What is out of the host Sampler's ranges in `row` (temperature [0, 100], top_p (0, 1], min_p [0, 1], uniform
// [0, 1]), or "" when nothing is.
std::string sample_row_problem(const SampleRow& row);

// Device memory of a GPU backend, in bytes.
struct DeviceMemory {
  int64_t total = 0;
  int64_t free = 0;
};

// Memory owned by a backend (host memory on CPU, device memory on GPUs).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when buffers are ordinary host memory, so weights can be used in place from a memory map.
  virtual bool host_memory() const { return false; }
  // The type a weight matrix stored as `file_type` is kept in (GPU backends: bf16 for quantized and f16 weights,
  // dequantized once at load, except block-scaled FP8 on CUDA sm_90; f32 and bf16 stay as they are).
  virtual DType matrix_storage_type(DType file_type) const { return file_type; }
  // Where matrix_storage_type keeps kFP8_E4M3_B128: whether a matrix of this shape, its first row `row_offset` rows
  // into its 128-row scale block, stays block-scaled; the loader stores the others as bf16.
  virtual bool keeps_block_scaled(int64_t rows, int64_t cols, int64_t row_offset) const {
    (void)rows, (void)cols, (void)row_offset;
    return true;
  }
  // Total and free memory of the device; nullopt for host-memory backends (they size the KV cache by physical RAM).
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }
  // True when store_kv and attention handle a KV cache of this element type.
  virtual bool supports_kv_dtype(DType t) const { return t == DType::kF32 || t == DType::kF16; }
  // True when attention and attention_latent honour AttentionBatch's draft-tree masks, and copy_kv_slots runs.
  virtual bool supports_tree_attention() const { return false; }

  virtual std::unique_ptr<Buffer> allocate(size_t bytes) = 0;
  // Backs all of `buffer` with memory now (contents unchanged), so its first use pays no page faults and a host
  // short of memory fails here rather than mid-serving. Device memory is resident once allocated: nothing to do.
  virtual void make_resident(Buffer& buffer) { (void)buffer; }
  // Copies host bytes into backend memory (a plain copy on CPU).
  virtual void upload(Buffer& dst, size_t offset, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const Buffer& src, size_t offset, size_t bytes) = 0;

  // out[t, :] = table row ids[t] (dequantized to f32).
  virtual void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) = 0;
  // y = x / rms(x) * w per row of width `dim`.
  virtual void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) = 0;
  // y[t, r] = x[t, :] . W[r, :] (+ bias[r] when bias is not null).
  virtual void matmul(const WeightMatrix& w, const float* bias, const float* x, int64_t n, float* y) = 0;
  // One matmul of several into `y` [n, w.rows] (with optional bias), for matmuls().
  struct MatmulOut {
    const WeightMatrix* w;
    const float* bias;
    float* y;
  };
  // Several matmuls of the same activations x (Q/K/V, gate/up); a backend may prepare x once for all of them.
  virtual void matmuls(std::span<const MatmulOut> outs, const float* x, int64_t n) {
    for (const MatmulOut& o : outs) matmul(*o.w, o.bias, x, n, o.y);
  }
  // In place on x [n, n_heads * head_dim] with per-token positions.
  virtual void rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) = 0;
  // Writes k, v [n, n_kv_heads * head_dim] into the cache slots `slots[t]` (block * page_size + offset).
  virtual void store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n) = 0;
  // Copies the cached K/V rows (or latent rows) of slots src[i] to slots dst[i], in order (host arrays): an accepted
  // draft-tree path moves into consecutive positions. Only where supports_tree_attention(); the default throws.
  virtual void copy_kv_slots(const KvLayerView& kv, const int32_t* src, const int32_t* dst, int64_t n);
  // out [n, n_heads * head_dim] = softmax(q k^T * scale) v over each token's visible cached positions (GQA).
  virtual void attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                         float scale, float* out) = 0;
  // A hint: a later attention() will read this cache for this batch, after other ops; the backend may start moving
  // it closer meanwhile. Never changes a result; the default does nothing.
  virtual void prefetch_attention(const KvLayerView& /*kv*/, const AttentionBatch& /*batch*/) {}
  // out[t, i] = silu(gate[t, i]) * up[t, i] for i < ffn; gate and up rows are `in_stride` apart, out rows `ffn`.
  virtual void silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out) = 0;
  // x += y elementwise over n values.
  virtual void add(float* x, const float* y, int64_t n) = 0;

  // Fused ops (compile = fused). add_rms_norm: x += residual, then y = rms_norm(x) per row (y may alias residual).
  virtual void add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps) = 0;
  // SwiGLU fused into the next matmul: y = (silu(gate) * up) . W^T, equal to silu_mul into `act` [n, w.cols] then
  // matmul(w, nullptr, act, n, y); a backend may make the SwiGLU rows inside the matmul instead of writing `act`.
  virtual void silu_mul_matmul(const WeightMatrix& w, const float* gate, const float* up, int64_t in_stride, int64_t n,
                               float* act, float* y) {
    silu_mul(gate, up, in_stride, n, w.cols, act);
    matmul(w, nullptr, act, n, y);
  }
  // Rotary fused into the QKV path: qkv rows hold [q | k | v] ([n_heads + 2 * kv.n_kv_heads] heads of head_dim);
  // writes rotated q to q_out [n, n_heads * head_dim] and stores rotated k and v into the cache slots `slots[t]`.
  virtual void rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots,
                              int64_t n, int64_t n_heads, const RopeParams& p, float* q_out) = 0;
  // Mixture-of-experts and latent attention (the MoE/MLA model families). The defaults throw Error(kUnsupported)
  // naming the backend; the CPU backend implements them.
  // dst[rows[i], :] += weights[i] * src[i, :] for i < n, in order (rows may repeat): an expert's outputs added back
  // into the tokens that chose it.
  virtual void scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n, int64_t width,
                                float* dst);
  // SwiGLU MLPs over row ranges: for each entry, rows [first, first + count) of x [*, gate.cols] become the same rows
  // of y = down . (silu(gate . x) * (up . x)). Routed experts over tokens grouped by expert (the permutation vLLM's
  // fused MoE and llama.cpp's mul_mat_id use) are one entry each, a dense MLP one entry of all rows. A backend may run
  // entries side by side.
  struct ExpertMlp {
    const WeightMatrix* gate;
    const WeightMatrix* up;
    const WeightMatrix* down;
    int64_t first;
    int64_t count;
  };
  virtual void expert_mlps(std::span<const ExpertMlp> experts, const float* x, float* y);
  // Routing on the device (GPUs; defaults: false / Error(kUnsupported)), so a mixture-of-experts layer needs no host
  // round trip: whether group_by_expert takes `routing`.
  virtual bool routes_on_device(const MoeRouting& routing) const {
    (void)routing;
    return false;
  }
  // Routes n tokens by `routing` (router logits [n, routing.n_experts], selection bias [n_experts] or null; the rule of
  // backend/moe_routing.h) and orders their n * top_k (token, expert) assignments by expert, stably (token order within
  // an expert): rows[i] and weights[i] are the token and routing weight of the i-th, and offsets[e] (n_experts + 1
  // values) where expert e's run starts. With real_tokens (one value; a graph's padded step) only the first
  // *real_tokens tokens are grouped: offsets[n_experts] = *real_tokens * top_k, and each later assignment i stays at i
  // with its token and weight 0. All backend memory.
  virtual void group_by_expert(const MoeRouting& routing, const float* logits, const float* bias, int64_t n,
                               const int32_t* real_tokens, int32_t* rows, float* weights, int32_t* offsets);
  // expert_mlps with the runs on the backend: experts[e] takes rows [offsets[e], offsets[e + 1]) of x; `rows` is
  // offsets' last value, which the host knows (n * top_k). `offsets` as group_by_expert writes them.
  struct ExpertWeights {
    const WeightMatrix* gate;
    const WeightMatrix* up;
    const WeightMatrix* down;
  };
  virtual void expert_mlps_grouped(std::span<const ExpertWeights> experts, const int32_t* offsets, int64_t rows,
                                   const float* x, float* y);
  // Per-head matmul: for each head h < n_heads, y[t, h] = W_h . x[t, h], where W_h is rows [h * rows_per_head,
  // (h + 1) * rows_per_head) of w, x[t, h] starts at x + t * x_row_stride + h * x_head_stride (w.cols values) and
  // y[t, h] at y + t * y_row_stride + h * y_head_stride (rows_per_head values). MLA's weight absorption.
  struct HeadStrides {
    int64_t row = 0;
    int64_t head = 0;
  };
  virtual void head_matmul(const WeightMatrix& w, int64_t n_heads, const float* x, HeadStrides x_strides, int64_t n,
                           float* y, HeadStrides y_strides);
  // dst row i = src row i for n rows of `width` values, rows src_stride and dst_stride apart (a strided slice copy).
  virtual void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t n, int64_t width);
  // Latent cache (MLA): kv.k holds one row of kv.head_dim values per slot (n_kv_heads 1, kv.v unused). Writes row t =
  // [latent[t] (latent_width values) | rope_key[t] (the other kv.head_dim - latent_width)] to slots[t].
  virtual void store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width, const float* rope_key,
                            const int32_t* slots, int64_t n);
  // Absorbed MLA attention: q [n, n_heads, kv.head_dim] scored against each visible cached row (every head shares
  // it), softmax(q . row * scale), and out [n, n_heads, v_dim] the weighted sum of the rows' first v_dim values.
  virtual void attention_latent(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                                int64_t v_dim, float scale, float* out);

  // Fills `n` values of `type` (f32 or bf16) at `dst` with N(mean, std) draws keyed by (seed, index), in place
  // (dummy weights without a host copy). Returns false when the backend leaves that to the host (CPU).
  virtual bool fill_random(void* /*dst*/, DType /*type*/, int64_t /*n*/, uint64_t /*seed*/, float /*mean*/, float /*std*/) {
    return false;
  }
  // Whether sample() draws on this backend (GPUs, and the CPU with its thread pool); otherwise the host Sampler does.
  virtual bool device_sampling() const { return false; }
  // Draws one token per row of `logits` [n, vocab] (backend memory) as rows[i] says and writes the n ids to host
  // `tokens`, so only ids leave the device. Only where device_sampling().
  virtual void sample(const float* logits, int64_t n, int64_t vocab, std::span<const SampleRow> rows, int32_t* tokens);
  // Graphs (compile = graphs): ops issued between begin_capture and end_capture are recorded, not run, as graph `key`
  // (a negative key discards them); replay_graph runs them again over whatever the buffers hold by then. Backends
  // without graphs (CPU) return false from begin_capture and record nothing.
  virtual bool begin_capture() { return false; }
  virtual void end_capture(int64_t /*key*/) {}
  virtual void replay_graph(int64_t /*key*/) {}
  virtual void drop_graphs() {}
  // Blocks until queued work is done (no-op on CPU).
  virtual void synchronize() {}
};

// Creates the backend for `device` ("cpu", or "cuda" / "hip" in a GPU build); `threads` sizes the CPU thread pool
// (0 = all cores). Error(kUnsupported) names the devices this build has. With SERVETUNE_PROFILE_OPS set ("1": stderr,
// else a file to append to) the backend is wrapped in a ProfilingBackend that writes per-op wall times when destroyed.
std::unique_ptr<Backend> make_backend(const std::string& device, int threads);
// Whether this build has a backend for `device`, and the list of those it has ("cpu, cuda").
bool backend_available(const std::string& device);
std::string available_backends();

}  // namespace servetune
