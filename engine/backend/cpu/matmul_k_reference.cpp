// Plain C++ k-quant kernels (Q4_K, Q5_K, Q6_K weights × Q8_K activations) and the Q8_K activation quantizer, following
// ggml's quantize_row_q8_K_ref and ggml_vec_dot_q{4,5,6}_K_q8_K: exact integer sums per super-block, scaled once.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_internal.h"
#include "core/half.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

// 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// A super-block's exact integer sums against one token's Q8_K quants: isum = Σ_sub scale·Σ q_w·q_x and, for types with
// mins, msum = Σ_sub min·Σ q_x.
struct KSums {
  int32_t isum = 0;
  int32_t msum = 0;
};

// Q4_K / Q5_K: 8 sub-blocks of 32; element 32j + l has the low (j even) or high (j odd) nibble of qs[32(j/2) + l]
// and, for Q5_K, bit j of qh[l] as its fifth bit.
template <class Block>
KSums q45_k_sums(const Block& b, const int8_t* q, const int16_t* bsums) {
  KSums s;
  for (int j = 0; j < 8; ++j) {
    int scale = 0, min = 0;
    scale_min_k4(j, b.scales, &scale, &min);
    const uint8_t* qs = b.qs + (j / 2) * 32;
    int sub = 0;
    for (int l = 0; l < 32; ++l) {
      int v = j % 2 == 0 ? (qs[l] & 0xF) : (qs[l] >> 4);
      if constexpr (std::is_same_v<Block, BlockQ5_K>) v |= ((b.qh[l] >> j) & 1) << 4;
      sub += v * q[j * 32 + l];
    }
    s.isum += scale * sub;
    s.msum += min * (bsums[2 * j] + bsums[2 * j + 1]);
  }
  return s;
}

// Q6_K: 16 sub-blocks of 16 with int8 scales; codes are 6-bit values − 32.
KSums q6_k_sums(const BlockQ6_K& b, const int8_t* q, const int16_t*) {
  int8_t v[kQK_K];
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int8_t* out = v + 128 * h;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      out[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      out[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      out[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
  KSums s;
  for (int j = 0; j < 16; ++j) {
    int sub = 0;
    for (int l = 0; l < 16; ++l) sub += v[16 * j + l] * q[16 * j + l];
    s.isum += b.scales[j] * sub;
  }
  return s;
}

// The canonical arithmetic of every k-quant kernel: per super-block the exact integer sums (|isum| < 2^28), then one
// f32 accumulator in super-block order, acc = fma(d_w·d_x, float(isum), acc), and for Q4_K / Q5_K the mins as a
// second chain mins = fma(dmin_w·d_x, float(msum), mins); the result acc − mins. One rounding per super-block where
// ggml's x86 vec_dot rounds per vector lane; like the legacy types' per-block fma, it lets the batched kernels keep
// tokens in lanes and spend one float op per super-block.
template <class Block, bool kHasMin, KSums (*kSums)(const Block&, const int8_t*, const int16_t*)>
void k_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
              int64_t y_stride) {
  const int64_t nb = w.cols / kQK_K;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int64_t t = t0; t < t1; ++t) {
      float acc = 0.0f;
      float mins = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        Block blk;
        std::memcpy(&blk, row + b * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
        const KSums s = kSums(blk, a.q + t * a.q_stride + b * kQK_K, a.bsums + t * a.bsum_stride + b * 16);
        const float dx = a.d[t * a.d_stride + b];
        acc = std::fma(fp16_to_f32(blk.d) * dx, static_cast<float>(s.isum), acc);
        if constexpr (kHasMin) mins = std::fma(fp16_to_f32(blk.dmin) * dx, static_cast<float>(s.msum), mins);
      }
      y[t * y_stride + r] = kHasMin ? acc - mins : acc;
    }
  }
}

}  // namespace

void quantize_q8k_reference(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                            int64_t q_stride, float* d, int64_t d_stride, int16_t* bsums, int64_t bsum_stride) {
  const int64_t nb = cols / kQK_K;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    int8_t* qt = q + t * q_stride;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xt + b * kQK_K;
      int8_t* qb = qt + b * kQK_K;
      float amax = 0.0f, max = 0.0f;
      for (int j = 0; j < kQK_K; ++j) {
        if (std::fabs(xb[j]) > amax) {
          amax = std::fabs(xb[j]);
          max = xb[j];
        }
      }
      if (amax == 0.0f) {
        d[t * d_stride + b] = 0.0f;
        std::memset(qb, 0, kQK_K);
      } else {
        const float iscale = -127.0f / max;
        for (int j = 0; j < kQK_K; ++j) {
          const float v = std::nearbyint(iscale * xb[j]);
          qb[j] = static_cast<int8_t>(v > 127.0f ? 127 : static_cast<int>(v));
        }
        d[t * d_stride + b] = 1.0f / iscale;
      }
      for (int j = 0; j < kQK_K / 16; ++j) {
        int sum = 0;
        for (int l = 0; l < 16; ++l) sum += qb[16 * j + l];
        bsums[t * bsum_stride + b * 16 + j] = static_cast<int16_t>(sum);
      }
    }
    std::memset(qt + cols, 0, static_cast<size_t>(q_stride - cols));
    for (int64_t b = nb; b < d_stride; ++b) d[t * d_stride + b] = 0.0f;
    for (int64_t j = nb * 16; j < bsum_stride; ++j) bsums[t * bsum_stride + j] = 0;
  }
}

RangeKernel reference_k_kernel_for(DType type) {
  switch (type) {
    case DType::kQ4_K:
      return k_kernel<BlockQ4_K, true, q45_k_sums<BlockQ4_K>>;
    case DType::kQ5_K:
      return k_kernel<BlockQ5_K, true, q45_k_sums<BlockQ5_K>>;
    case DType::kQ6_K:
      return k_kernel<BlockQ6_K, false, q6_k_sums>;
    default:
      return nullptr;
  }
}

}  // namespace servetune::cpu::detail
