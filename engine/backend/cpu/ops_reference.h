// Plain C++ reference kernels for every backend op except matmul (which lives in matmul.h): the oracle that
// SIMD and GPU kernels are tested against. Numerics follow ggml's CPU ops (double-accumulated RMS norm,
// float rotary angles by repeated multiplication) so greedy outputs match llama.cpp.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace servetune::cpu::ref {

void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out);
void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps);
// x += residual, then y = rms_norm(x), row by row (y may alias residual).
void add_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps);
// Fills cos_sin [rope_dim] (interleaved cos, sin per pair) for one position.
void rope_cache(float position, const RopeParams& p, float* cos_sin);
// Rotates n_heads consecutive head vectors (head_dim apart) in place with a precomputed cache.
void rope_heads(float* x, int64_t n_heads, const float* cos_sin, const RopeParams& p);
void rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p);
// Stores one token's v row ([n_kv_heads * head_dim] floats) into cache slot `slot` of kv.v (row layout).
void store_v_row(const KvLayerView& kv, const float* row, int64_t slot);
// Stores one token's k row into cache slot `slot` of kv.k, transposed within its page (kv_layout.h).
void store_k_row(const KvLayerView& kv, const float* row, int64_t slot);
// Attention of token t, head h (writes head_dim floats to out). `scratch` holds attention_span(batch, t) floats.
void attention_head(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                    int64_t t, int64_t h, float* scratch, float* out);
// Token t's [q | k | v] row: rotated q to q_out, rotated k and v stored into cache slot `slot`.
void rope_store_qkv_row(const KvLayerView& kv, const float* qkv_row, float position, int64_t slot, int64_t n_heads,
                        const RopeParams& p, float* q_out_row, float* cos_sin, float* k_scratch);
void silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out);

}  // namespace servetune::cpu::ref
