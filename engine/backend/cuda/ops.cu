// Elementwise and row kernels of the GPU backend: embedding rows, RMSNorm (optionally fused with the residual add),
// rotary embedding, KV-cache stores and slot copies, SwiGLU, adds and the f32 -> bf16 cast. Numerics follow backend/cpu/ops_reference.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/elem.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace servetune::gpu {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

__global__ void embed_kernel(const void* table, int type, int64_t rows, int64_t cols, int64_t row_elems,
                             const int32_t* ids, float* out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    out[t * cols + i] = (id >= 0 && id < rows) ? load_elem(table, id * row_elems + i, type) : 0.0f;
  }
}

__device__ double block_sum(double v, double* shared) {
  v = warp_sum(v);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  double total = 0.0;
  for (int w = 0; w < n_warps; ++w) total += shared[w];
  return total;
}

// Squares in float summed in double, as the CPU reference does.
__global__ void rms_norm_kernel(float* x, const float* residual, const float* w, float* y, uint16_t* y_bf16, int64_t dim,
                                float eps) {
  __shared__ double partial[kThreads / 32];
  float* xr = x + blockIdx.x * dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = xr[i];
    if (residual != nullptr) {
      v += residual[blockIdx.x * dim + i];
      xr[i] = v;
    }
    sum += static_cast<double>(v * v);
  }
  const double total = block_sum(sum, partial);
  const float mean = static_cast<float>(total / static_cast<double>(dim));
  const float scale = 1.0f / sqrtf(mean + eps);
  float* yr = y + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = (xr[i] * scale) * w[i];
    yr[i] = v;
    if (y_bf16 != nullptr) y_bf16[blockIdx.x * dim + i] = f32_to_bf16_bits(v);
  }
}

struct RopeArgs {
  int64_t head_dim, rope_dim;
  float theta_scale, freq_scale;
  bool neox;
  const float* freq_factors;
};

RopeArgs rope_args(const RopeParams& p, float theta_scale) {
  return RopeArgs{p.head_dim, p.rope_dim, theta_scale, p.freq_scale, p.neox, p.freq_factors};
}

// Rotates pair `pair` of head vector `src` into `dst` (may alias). The angle is built by repeated multiplication like
// the CPU reference, so both give the same angles bit for bit before cos/sin.
__device__ inline void rope_pair(const float* src, float* dst, float position, int64_t pair, const RopeArgs& r) {
  float theta = position;
  for (int64_t j = 0; j < pair; ++j) theta *= r.theta_scale;
  const float ff = r.freq_factors != nullptr ? r.freq_factors[pair] : 1.0f;
  const float angle = r.freq_scale * (theta / ff);
  const float c = cosf(angle), s = sinf(angle);
  const int64_t half = r.rope_dim / 2;
  const int64_t a = r.neox ? pair : 2 * pair;
  const int64_t b = r.neox ? pair + half : 2 * pair + 1;
  const float x0 = src[a], x1 = src[b];
  dst[a] = x0 * c - x1 * s;
  dst[b] = x0 * s + x1 * c;
}

// One block per (token, head); thread i rotates pair i.
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t n_heads, RopeArgs r) {
  const int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  float* xh = x + (t * n_heads + h) * r.head_dim;
  for (int64_t pair = threadIdx.x; pair < r.rope_dim / 2; pair += blockDim.x) {
    rope_pair(xh, xh, static_cast<float>(positions[t]), pair, r);
  }
}

// One block per (token, head of q, k or v): q heads rotate into q_out, k heads rotate into the cache (through shared
// memory), v heads are copied into the cache.
__global__ void rope_store_qkv_kernel(void* kc, void* vc, int code, int64_t n_kv_heads, const float* qkv,
                                      const int32_t* positions, const int32_t* slots, int64_t n_heads, RopeArgs r,
                                      float* q_out) {
  extern __shared__ float head[];
  const int64_t heads = n_heads + 2 * n_kv_heads;
  const int64_t t = blockIdx.x / heads, h = blockIdx.x % heads, hd = r.head_dim;
  const float* src = qkv + (t * heads + h) * hd;
  const float position = static_cast<float>(positions[t]);
  const int64_t kv_width = n_kv_heads * hd;
  if (h >= n_heads + n_kv_heads) {  // v
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
      store_elem(vc, slots[t] * kv_width + (h - n_heads - n_kv_heads) * hd + d, code, src[d]);
    }
    return;
  }
  float* dst = h < n_heads ? q_out + (t * n_heads + h) * hd : head;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = src[d];
  __syncthreads();
  for (int64_t pair = threadIdx.x; pair < r.rope_dim / 2; pair += blockDim.x) rope_pair(dst, dst, position, pair, r);
  if (h < n_heads) return;
  __syncthreads();
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) store_elem(kc, slots[t] * kv_width + (h - n_heads) * hd + d, code, head[d]);
}

__global__ void store_kv_kernel(void* kc, void* vc, int code, const float* k, const float* v, const int32_t* slots,
                                int64_t width) {
  const int64_t t = blockIdx.x;
  const int64_t base = static_cast<int64_t>(slots[t]) * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    store_elem(kc, base + i, code, k[t * width + i]);
    store_elem(vc, base + i, code, v[t * width + i]);
  }
}

// Slot pairs one copy_kv_slots launch carries in its parameters (the caller's arrays are host memory: no upload).
constexpr int kCopyPairs = 64;
struct SlotPairs {
  int32_t src[kCopyPairs];
  int32_t dst[kCopyPairs];
  int n;
};

// One thread per 2-byte column of a slot's row (K and V alike; v null: a latent cache), the pairs in order, so that a
// pair reading an earlier pair's dst reads the copied value (columns are independent of each other).
__global__ void copy_kv_slots_kernel(unsigned short* k, unsigned short* v, int64_t row_units, SlotPairs pairs) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < row_units;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int i = 0; i < pairs.n; ++i) {
      const int64_t from = static_cast<int64_t>(pairs.src[i]) * row_units + c;
      const int64_t to = static_cast<int64_t>(pairs.dst[i]) * row_units + c;
      k[to] = k[from];
      if (v != nullptr) v[to] = v[from];
    }
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out,
                                uint16_t* out_bf16) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * ffn;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / ffn, c = i % ffn;
    const float g = gate[t * in_stride + c];
    const float v = (g / (1.0f + expf(-g))) * up[t * in_stride + c];
    out[i] = v;
    if (out_bf16 != nullptr) out_bf16[i] = f32_to_bf16_bits(v);
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t n, int64_t rows) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % rows];
  }
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = f32_to_bf16_bits(x[i]);
  }
}

// splitmix64's finaliser of a counter: a stateless hash, so any thread can draw any index.
__device__ inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(void* dst, bool bf16, int64_t n, uint64_t seed, float mean, float std) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t pair = static_cast<uint64_t>(i / 2);
    const float u1 = (static_cast<float>(mix64(seed + 2 * pair) >> 40) + 0.5f) * 0x1.0p-24f;
    const float u2 = static_cast<float>(mix64(seed + 2 * pair + 1) >> 40) * 0x1.0p-24f;
    const float r = sqrtf(-2.0f * logf(u1));
    const float angle = 6.28318530718f * u2;
    const float v = mean + std * r * ((i & 1) == 0 ? cosf(angle) : sinf(angle));
    if (bf16) static_cast<uint16_t*>(dst)[i] = f32_to_bf16_bits(v);
    else static_cast<float*>(dst)[i] = v;
  }
}

}  // namespace

void launch_fill_random(void* dst, bool bf16, int64_t n, uint64_t seed, float mean, float std, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, bf16, n, seed, mean, std);
  check(cudaGetLastError(), "fill_random kernel");
}

void launch_embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t elem = table.type == DType::kF32 ? 4 : 2;
  embed_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(table.data, elem_code(table.type), table.rows, table.cols,
                                                                   table.row_bytes / elem, ids, out);
  check(cudaGetLastError(), "embed kernel");
}

void launch_rms_norm(float* x, const float* residual, const float* w, float* y, int64_t n, int64_t dim, float eps,
                     cudaStream_t stream, uint16_t* y_bf16) {
  if (n == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, residual, w, y, y_bf16, dim, eps);
  check(cudaGetLastError(), "rms_norm kernel");
}

void launch_rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p, float theta_scale,
                 const float* freq_factors, cudaStream_t stream) {
  if (n == 0 || n_heads == 0) return;
  RopeArgs r = rope_args(p, theta_scale);
  r.freq_factors = freq_factors;
  rope_kernel<<<static_cast<unsigned>(n * n_heads), 64, 0, stream>>>(x, positions, n_heads, r);
  check(cudaGetLastError(), "rope kernel");
}

void launch_rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots,
                           int64_t n, int64_t n_heads, const RopeParams& p, float theta_scale, float* q_out,
                           cudaStream_t stream) {
  if (n == 0) return;
  const int64_t heads = n_heads + 2 * kv.n_kv_heads;
  rope_store_qkv_kernel<<<static_cast<unsigned>(n * heads), 64, static_cast<size_t>(p.head_dim) * sizeof(float), stream>>>(
      kv.k, kv.v, elem_code(kv.dtype), kv.n_kv_heads, qkv, positions, slots, n_heads, rope_args(p, theta_scale), q_out);
  check(cudaGetLastError(), "rope_store_qkv kernel");
}

void launch_store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n,
                     cudaStream_t stream) {
  if (n == 0) return;
  store_kv_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(kv.k, kv.v, elem_code(kv.dtype), k, v, slots,
                                                                     kv.n_kv_heads * kv.head_dim);
  check(cudaGetLastError(), "store_kv kernel");
}

void launch_copy_kv_slots(const KvLayerView& kv, const int32_t* src, const int32_t* dst, int64_t n, cudaStream_t stream) {
  const int64_t capacity = kv.num_blocks * kv.page_size;
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] < 0 || src[i] >= capacity || dst[i] < 0 || dst[i] >= capacity) {
      throw Error(ErrorKind::kInternal, "copy_kv_slots: slot pair " + std::to_string(src[i]) + " -> " +
                                            std::to_string(dst[i]) + " outside the cache's " + std::to_string(capacity));
    }
  }
  const int64_t row_units = kv.n_kv_heads * kv.head_dim * static_cast<int64_t>(dtype_info(kv.dtype).type_size) / 2;
  if (n == 0 || row_units == 0) return;
  auto* k = static_cast<unsigned short*>(kv.k);
  auto* v = static_cast<unsigned short*>(kv.v);
  // Launches of up to kCopyPairs pairs, in order on the stream: later pairs see earlier ones' copies.
  for (int64_t first = 0; first < n; first += kCopyPairs) {
    SlotPairs pairs{};
    pairs.n = static_cast<int>(std::min<int64_t>(kCopyPairs, n - first));
    for (int i = 0; i < pairs.n; ++i) {
      pairs.src[i] = src[first + i];
      pairs.dst[i] = dst[first + i];
    }
    copy_kv_slots_kernel<<<blocks_for(row_units), kThreads, 0, stream>>>(k, v, row_units, pairs);
    check(cudaGetLastError(), "copy_kv_slots kernel");
  }
}

void launch_silu_mul(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn, float* out,
                     cudaStream_t stream, uint16_t* out_bf16) {
  if (n * ffn == 0) return;
  silu_mul_kernel<<<blocks_for(n * ffn), kThreads, 0, stream>>>(gate, up, in_stride, n, ffn, out, out_bf16);
  check(cudaGetLastError(), "silu_mul kernel");
}

void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  check(cudaGetLastError(), "add kernel");
}

void launch_add_bias(float* y, const float* bias, int64_t n, int64_t rows, cudaStream_t stream) {
  if (n * rows == 0) return;
  add_bias_kernel<<<blocks_for(n * rows), kThreads, 0, stream>>>(y, bias, n, rows);
  check(cudaGetLastError(), "add_bias kernel");
}

void launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  check(cudaGetLastError(), "to_bf16 kernel");
}

}  // namespace servetune::gpu
