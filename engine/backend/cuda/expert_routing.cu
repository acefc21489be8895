// Mixture-of-experts routing on the device (Backend::group_by_expert), so a layer's experts run without the router's
// logits coming to the host: each token routed by the same inline code the host uses (moe_route_token.h; a thread per
// token, its scratch in shared memory), the n * top_k assignments grouped by expert in one block (counts by shared
// atomics, offsets by a scan, then a stable scatter: 1024 assignments at a time, warp after warp, lanes of one expert
// ranked by __match_any_sync, so each expert's run keeps token order as the host's counting sort does; a graph's
// padding tokens are left out), and the grouped GEMM's tile plan made from the offsets.
#include "backend/cuda/moe_kernels.h"
#include "backend/moe_route_token.h"
#include "core/error.h"

namespace servetune::gpu {

#if !defined(SERVETUNE_HIP)
namespace {

constexpr int kRouteThreads = 8;  // tokens per block: 8 x 4.5 KiB of scratch at most
constexpr int kGroupThreads = 1024;

__global__ void __launch_bounds__(kRouteThreads) route_kernel(MoeRouting r, const float* logits, const float* bias, int64_t n,
                                                              int32_t* ids, float* weights) {
  __shared__ float scores[kRouteThreads][kMaxRoutedExperts];
  __shared__ float keys[kRouteThreads][kMaxRoutedExperts];
  __shared__ float group_keys[kRouteThreads][kMaxRoutedGroups];
  __shared__ int32_t kept[kRouteThreads][kMaxRoutedGroups];
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteThreads + threadIdx.x;
  if (t >= n) return;
  const int i = static_cast<int>(threadIdx.x);
  moe_route::route_token(r, logits + t * r.n_experts, bias, ids + t * r.top_k, weights + t * r.top_k, scores[i], keys[i],
                         group_keys[i], kept[i]);
}

__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int32_t* ids, const float* weights, int total,
                                                              const int32_t* real_tokens, int top_k, int n_experts,
                                                              int32_t* rows, float* grouped, int32_t* offsets) {
  __shared__ int counts[kMaxRoutedExperts];
  __shared__ int next[kMaxRoutedExperts];  // each expert's next free position
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  // A padded step's padding tokens (the last ones) are not grouped: their assignments keep their places, weight 0.
  const int grouped_total = real_tokens != nullptr ? min(total, *real_tokens * top_k) : total;
  for (int e = tid; e < n_experts; e += kGroupThreads) counts[e] = 0;
  __syncthreads();
  for (int i = tid; i < grouped_total; i += kGroupThreads) atomicAdd(&counts[ids[i]], 1);
  for (int i = grouped_total + tid; i < total; i += kGroupThreads) {
    rows[i] = i / top_k;
    grouped[i] = 0.0f;
  }
  __syncthreads();
  if (tid == 0) {  // at most 512 experts: a serial scan is a few microseconds
    int sum = 0;
    for (int e = 0; e < n_experts; ++e) {
      next[e] = sum;
      offsets[e] = sum;
      sum += counts[e];
    }
    offsets[n_experts] = sum;
  }
  __syncthreads();
  for (int c0 = 0; c0 < grouped_total; c0 += kGroupThreads) {
    const int i = c0 + tid;
    const bool valid = i < grouped_total;
    const int e = valid ? ids[i] : -1;
    const unsigned valid_lanes = __ballot_sync(0xffffffffu, valid);
    for (int w = 0; w < kGroupThreads / 32 && c0 + 32 * w < grouped_total; ++w) {  // the same bound in every thread
      if (warp == w && valid) {
        const unsigned peers = __match_any_sync(valid_lanes, e);
        const int pos = next[e] + __popc(peers & ((1u << lane) - 1u));
        rows[pos] = i / top_k;
        grouped[pos] = weights[i];
        __syncwarp(valid_lanes);  // every lane has read next[e] before the last of its peers moves it
        if (lane == 31 - __clz(peers)) next[e] += __popc(peers);
      }
      __syncthreads();
    }
  }
}

__global__ void plan_kernel(const int32_t* offsets, int n_experts, int tile_rows, int32_t* tile_count, ExpertTile* tiles) {
  __shared__ int first_tile[kMaxRoutedExperts];
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int e = 0; e < n_experts; ++e) {
      first_tile[e] = sum;
      sum += (offsets[e + 1] - offsets[e] + tile_rows - 1) / tile_rows;
    }
    *tile_count = sum;
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < n_experts; e += static_cast<int>(blockDim.x)) {
    const int first = offsets[e], count = offsets[e + 1] - first;
    for (int j = 0; j * tile_rows < count; ++j) {
      ExpertTile tile;
      tile.entry = e;
      tile.rows = min(tile_rows, count - j * tile_rows);
      tile.row0 = first + j * tile_rows;
      tiles[first_tile[e] + j] = tile;
    }
  }
}

}  // namespace
#endif

void launch_route_experts(const MoeRouting& routing, const float* logits, const float* bias, int64_t n, int32_t* ids,
                          float* weights, cudaStream_t stream) {
#if defined(SERVETUNE_HIP)
  (void)routing, (void)logits, (void)bias, (void)n, (void)ids, (void)weights, (void)stream;
  throw_unsupported("routing on the device needs the CUDA build");
#else
  if (routing.n_experts > kMaxRoutedExperts || routing.n_group > kMaxRoutedGroups || routing.topk_group > kMaxRoutedGroups) {
    throw Error(ErrorKind::kInternal, "device routing: more experts or groups than its scratch holds");
  }
  if (n <= 0) return;
  const auto blocks = static_cast<unsigned>((n + kRouteThreads - 1) / kRouteThreads);
  route_kernel<<<blocks, kRouteThreads, 0, stream>>>(routing, logits, bias, n, ids, weights);
  check(cudaGetLastError(), "routing kernel");
#endif
}

void launch_group_by_expert(const int32_t* ids, const float* weights, int64_t n, const int32_t* real_tokens, int64_t top_k,
                            int64_t n_experts, int32_t* rows, float* grouped_weights, int32_t* offsets,
                            cudaStream_t stream) {
#if defined(SERVETUNE_HIP)
  (void)ids, (void)weights, (void)n, (void)real_tokens, (void)top_k, (void)n_experts, (void)rows, (void)grouped_weights,
      (void)offsets, (void)stream;
  throw_unsupported("routing on the device needs the CUDA build");
#else
  if (n_experts > kMaxRoutedExperts || n * top_k > INT32_MAX) {
    throw Error(ErrorKind::kInternal, "device expert grouping: too many experts or assignments");
  }
  group_kernel<<<1, kGroupThreads, 0, stream>>>(ids, weights, static_cast<int>(n * top_k), real_tokens,
                                                static_cast<int>(top_k), static_cast<int>(n_experts), rows,
                                                grouped_weights, offsets);
  check(cudaGetLastError(), "expert grouping kernel");
#endif
}

void launch_plan_expert_tiles(const int32_t* offsets, int64_t n_experts, int tile_rows, int32_t* tile_count,
                              ExpertTile* tiles, cudaStream_t stream) {
#if defined(SERVETUNE_HIP)
  (void)offsets, (void)n_experts, (void)tile_rows, (void)tile_count, (void)tiles, (void)stream;
  throw_unsupported("routing on the device needs the CUDA build");
#else
  if (n_experts > kMaxRoutedExperts) throw Error(ErrorKind::kInternal, "device tile plan: too many experts");
  plan_kernel<<<1, 256, 0, stream>>>(offsets, static_cast<int>(n_experts), tile_rows, tile_count, tiles);
  check(cudaGetLastError(), "expert tile plan kernel");
#endif
}

}  // namespace servetune::gpu
