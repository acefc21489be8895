// Launchers of the GPU kernels behind the CUDA/HIP backend (ops.cu, attention.cu, decode_attention_split.cu, gemm.cu,
// sample.cu); all take device pointers and run on `stream`. Element types of tables, weights and caches: f32, f16 or bf16 (by DType).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/gpu_shim.h"
#include "backend/cuda/split_attention_plan.h"

namespace servetune::gpu {

// out[t, :] = table row ids[t] as f32 (table f32, f16 or bf16).
void launch_embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out, cudaStream_t stream);
// y = x / rms(x) * w per row; when `residual` is not null it is first added to x in place (fused add + norm). With
// y_bf16, y is also written there as bf16 (as launch_to_bf16 rounds), for the GEMM that reads it next.
void launch_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps,
                     cudaStream_t stream, uint16_t* y_bf16 = nullptr);
// Rotary embedding in place, angles as the CPU reference computes them (theta_scale = theta^(-2/rope_dim)).
void launch_rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p, float theta_scale,
                 const float* freq_factors, cudaStream_t stream);
// Rotary fused into the QKV path (see Backend::rope_store_qkv).
void launch_rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots,
                           int64_t n, int64_t n_heads, const RopeParams& p, float theta_scale, float* q_out,
                           cudaStream_t stream);
void launch_store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n,
                     cudaStream_t stream);
// Cache rows (every KV head; K and V, or the latent row when kv.v is null) of slots src[i] copied to dst[i], in order
// (see Backend::copy_kv_slots); src and dst are host arrays, checked against the cache's slots.
void launch_copy_kv_slots(const KvLayerView& kv, const int32_t* src, const int32_t* dst, int64_t n, cudaStream_t stream);
// out = silu(gate) * up (Backend::silu_mul); with out_bf16, out is also written there as bf16.
void launch_silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out,
                     cudaStream_t stream, uint16_t* out_bf16 = nullptr);
void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream);
// y[t, r] += bias[r] for y [n, rows].
void launch_add_bias(float* y, const float* bias, int64_t n, int64_t rows, cudaStream_t stream);
// f32 -> bf16 bits, n values.
void launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// n values of N(mean, std) (f32 or bf16 storage), each a pure function of (seed, index): dummy weights in place.
void launch_fill_random(void* dst, bool bf16, int64_t n, uint64_t seed, float mean, float std, cudaStream_t stream);
// Paged attention over each token's visible positions (see Backend::attention); head_dim <= 256.
void launch_attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                      float* out, cudaStream_t stream);
// The split (flash-decoding) plan for this attention call on a GPU of sm_count SMs: n_chunks == 1 (use
// launch_attention) unless the batch is too small to fill the GPU and its contexts are long, or when the split kernel
// does not take the shape (head_dim other than 64, 128, 256; K/V not 16-byte aligned).
SplitPlan plan_attention_split(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads, int64_t sm_count);
// Floats of device scratch launch_attention_split needs for `plan`.
size_t split_attention_scratch_floats(const SplitPlan& plan, int64_t n_tokens, int64_t n_heads, int64_t head_dim);
// launch_attention's result by flash-decoding along `plan` (n_chunks > 1), partials in `scratch`.
void launch_attention_split(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                            float scale, const SplitPlan& plan, float* scratch, float* out, cudaStream_t stream);
// One token per row of logits [n, vocab] drawn as rows[i] (device memory) says (see Backend::sample), ids to `tokens`.
void launch_sample(const float* logits, int64_t n, int64_t vocab, const SampleRow* rows, int32_t* tokens,
                   cudaStream_t stream);
// y[n, rows] = x[n, cols] . W^T with W f32 or bf16 [rows, cols] (plain tiled kernel: the HIP build's GEMM).
void launch_gemm_tiled(const WeightMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream);

}  // namespace servetune::gpu
