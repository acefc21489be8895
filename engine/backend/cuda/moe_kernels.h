// Launchers of the GPU kernels behind the mixture-of-experts and latent-attention (MLA) ops of the CUDA/HIP backend
// (moe.cu, expert_routing.cu, latent.cu, and gemm.cu's batched tiled GEMM); all take device pointers (index arrays included) and run on
// `stream`. Semantics as Backend's declarations in backend/backend.h.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/expert_gemm_plan.h"
#include "backend/cuda/gpu_shim.h"

namespace servetune::gpu {

// dst[rows[i], :] += weights[i] * src[i, :] for i < n, in order per destination row (deterministic: no float atomics).
void launch_scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n, int64_t width,
                             float* dst, cudaStream_t stream);
// dst[(h * n + t) * cols + c] = x[t * x_row + h * x_head + c] as bf16 bits (c < cols): head_matmul's per-head inputs
// packed for a strided batched bf16 GEMM.
void launch_pack_heads_bf16(const float* x, int64_t x_row, int64_t x_head, int64_t n, int64_t n_heads, int64_t cols,
                            uint16_t* dst, cudaStream_t stream);
// For each batch b < batches: y_b[t, r] = x_b[t, :] . W_b[r, :] (t < n, r < rows), where W_b is rows [b * rows,
// (b + 1) * rows) of w (w.cols columns), x_b row t starts at x + b * x_batch + t * x_ld and y_b row t at
// y + b * y_batch + t * y_ld. The tiled kernel (HIP's GEMM) with strides: head_matmul without a BLAS library.
void launch_gemm_tiled_batched(const WeightMatrix& w, int64_t rows, int64_t batches, const float* x, int64_t x_ld,
                               int64_t x_batch, int64_t n, float* y, int64_t y_ld, int64_t y_batch, cudaStream_t stream);
// Latent rows [latent[t] | rope_key[t]] into cache slots slots[t] (Backend::store_latent); kv.dtype f32, f16 or bf16.
void launch_store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width, const float* rope_key,
                         const int32_t* slots, int64_t n, cudaStream_t stream);
// Floats of the split-K scratch launch_attention_latent needs for this batch (0: it runs unsplit).
int64_t attention_latent_scratch_floats(const KvLayerView& kv, const AttentionBatch& batch, int64_t n_heads, int64_t v_dim);
// Absorbed MLA attention (Backend::attention_latent), causal only (no draft trees). `scratch` holds at least
// attention_latent_scratch_floats(...) floats (may be null when that is 0). kv.head_dim <= kMaxLatentWidth.
constexpr int64_t kMaxLatentWidth = 640;
void launch_attention_latent(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads,
                             int64_t v_dim, float scale, float* out, float* scratch, cudaStream_t stream);

// Routing on the device (Backend::group_by_expert): the most experts and expert groups the routing kernel's scratch
// holds, per-token routing (moe_route_token.h) into ids / weights [n, top_k], then the stable grouping of the
// n * top_k assignments by expert (rows, weights, offsets; real_tokens as Backend::group_by_expert says), and a tile plan of tile_rows rows made from those offsets
// (tile_count, then tiles in expert order; at most rows / tile_rows + n_experts tiles). CUDA only (the grouping uses
// __match_any_sync); the HIP build throws Error(kUnsupported).
constexpr int64_t kMaxRoutedExperts = 512;
constexpr int64_t kMaxRoutedGroups = 64;
void launch_route_experts(const MoeRouting& routing, const float* logits, const float* bias, int64_t n, int32_t* ids,
                          float* weights, cudaStream_t stream);
void launch_group_by_expert(const int32_t* ids, const float* weights, int64_t n, const int32_t* real_tokens, int64_t top_k,
                            int64_t n_experts, int32_t* rows, float* grouped_weights, int32_t* offsets,
                            cudaStream_t stream);
void launch_plan_expert_tiles(const int32_t* offsets, int64_t n_experts, int tile_rows, int32_t* tile_count,
                              ExpertTile* tiles, cudaStream_t stream);

}  // namespace servetune::gpu
