// Paged attention for flattened varlen batches (prefill and decode alike): one block per (token, query head); each
// warp walks a strided share of the token's visible positions through the block table with an online softmax, and
// the warps' partial results are merged at the end. GQA maps query head h to KV head h / (n_heads / n_kv_heads).
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace servetune::gpu {
namespace {

constexpr int kWarps = 8;  // 8 warps split a long context 8 ways (decode has few (token, head) blocks)
constexpr int kMaxHeadDim = 256;

template <int kPerLane>
__global__ void attention_kernel(const void* k_cache, const void* v_cache, bool f16, int64_t page_size, int64_t n_kv_heads,
                                 int64_t head_dim, const int32_t* positions, const int32_t* seq_of_token,
                                 const int32_t* block_tables, int64_t max_blocks, const float* q, int64_t n_heads,
                                 float scale, float* out) {
  __shared__ float sm_m[kWarps], sm_l[kWarps];
  __shared__ float sm_acc[kWarps][kPerLane * kWarpSize];
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t kv_head = h / (n_heads / n_kv_heads);
  const int64_t width = n_kv_heads * head_dim;
  const int64_t n_ctx = static_cast<int64_t>(positions[t]) + 1;
  const int32_t* table = block_tables + static_cast<int64_t>(seq_of_token[t]) * max_blocks;
  const float* qh = q + (t * n_heads + h) * head_dim;

  float qv[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t d = lane + i * kWarpSize;
    qv[i] = d < head_dim ? qh[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < n_ctx; j += kWarps) {
    const int64_t slot = static_cast<int64_t>(table[j / page_size]) * page_size + j % page_size;
    const int64_t base = slot * width + kv_head * head_dim;
    float kv[kPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + i * kWarpSize;
      kv[i] = 0.0f;
      if (d < head_dim) {
        kv[i] = f16 ? fp16_bits_to_f32(static_cast<const unsigned short*>(k_cache)[base + d])
                    : static_cast<const float*>(k_cache)[base + d];
      }
      dot += qv[i] * kv[i];
    }
    const float score = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new);
    const float p = expf(score - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + i * kWarpSize;
      float vv = 0.0f;
      if (d < head_dim) {
        vv = f16 ? fp16_bits_to_f32(static_cast<const unsigned short*>(v_cache)[base + d])
                 : static_cast<const float*>(v_cache)[base + d];
      }
      acc[i] = acc[i] * correction + p * vv;
    }
    m = m_new;
  }
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) sm_acc[warp][lane + i * kWarpSize] = acc[i];
  __syncthreads();

  float m_all = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, sm_m[w]);
  float l_all = 0.0f;
  for (int w = 0; w < kWarps; ++w) l_all += sm_l[w] * expf(sm_m[w] - m_all);  // a warp with no positions has l = 0
  const float inv = 1.0f / l_all;
  float* oh = out + (t * n_heads + h) * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (sm_l[w] > 0.0f) sum += sm_acc[w][d] * expf(sm_m[w] - m_all);
    }
    oh[d] = sum * inv;
  }
}

template <int kPerLane>
void launch_with(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, float scale, float* out,
                 cudaStream_t stream) {
  attention_kernel<kPerLane><<<static_cast<unsigned>(b.n_tokens * n_heads), kWarps * kWarpSize, 0, stream>>>(
      kv.k, kv.v, kv.dtype == DType::kF16, kv.page_size, kv.n_kv_heads, kv.head_dim, b.positions, b.seq_of_token,
      b.block_tables, b.max_blocks_per_seq, q, n_heads, scale, out);
  check(cudaGetLastError(), "attention kernel");
}

}  // namespace

void launch_attention(const KvLayerView& kv, const AttentionBatch& batch, const float* q, int64_t n_heads, float scale,
                      float* out, cudaStream_t stream) {
  if (batch.n_tokens == 0) return;
  if (kv.head_dim > kMaxHeadDim) {
    throw_unsupported("head_dim " + std::to_string(kv.head_dim) + " exceeds the GPU attention kernel's limit (" +
                      std::to_string(kMaxHeadDim) + ")");
  }
  const int64_t per_lane = (kv.head_dim + kWarpSize - 1) / kWarpSize;
  if (per_lane <= 1) launch_with<1>(kv, batch, q, n_heads, scale, out, stream);
  else if (per_lane <= 2) launch_with<2>(kv, batch, q, n_heads, scale, out, stream);
  else if (per_lane <= 4) launch_with<4>(kv, batch, q, n_heads, scale, out, stream);
  else launch_with<kMaxHeadDim / kWarpSize>(kv, batch, q, n_heads, scale, out, stream);
}

}  // namespace servetune::gpu
