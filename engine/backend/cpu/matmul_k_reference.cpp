// Plain C++ k-quant kernels (Q4_K, Q6_K weights × Q8_K activations) and the Q8_K activation quantizer, following
// ggml's quantize_row_q8_K_ref and ggml_vec_dot_q{4,6}_K_q8_K: integer sums per super-block, scaled once.
#include <cmath>
#include <cstring>

#include "backend/cpu/matmul_internal.h"
#include "core/half.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

// 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <class Block, class SuperBlockDot>
void k_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
              int64_t y_stride, SuperBlockDot dot) {
  const int64_t nb = w.cols / kQK_K;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int64_t t = t0; t < t1; ++t) {
      float sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        Block blk;
        std::memcpy(&blk, row + b * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
        sum +=
            dot(blk, a.q + t * a.q_stride + b * kQK_K, a.d[t * a.d_stride + b], a.bsums + t * a.bsum_stride + b * 16);
      }
      y[t * y_stride + r] = sum;
    }
  }
}

void q4_k_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  k_kernel<BlockQ4_K>(w, a, r0, r1, t0, t1, y, y_stride,
                      [](const BlockQ4_K& b, const int8_t* q, float dx, const int16_t* bsums) {
                        int64_t isum = 0, min_sum = 0;
                        for (int j = 0; j < 8; ++j) {
                          int scale = 0, min = 0;
                          scale_min_k4(j, b.scales, &scale, &min);
                          const uint8_t* qs = b.qs + (j / 2) * 32;
                          int sub = 0;
                          for (int l = 0; l < 32; ++l) {
                            const int v = j % 2 == 0 ? (qs[l] & 0xF) : (qs[l] >> 4);
                            sub += v * q[j * 32 + l];
                          }
                          isum += static_cast<int64_t>(scale) * sub;
                          min_sum += static_cast<int64_t>(min) * (bsums[2 * j] + bsums[2 * j + 1]);
                        }
                        return fp16_to_f32(b.d) * dx * static_cast<float>(isum) -
                               fp16_to_f32(b.dmin) * dx * static_cast<float>(min_sum);
                      });
}

void q6_k_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  k_kernel<BlockQ6_K>(w, a, r0, r1, t0, t1, y, y_stride,
                      [](const BlockQ6_K& b, const int8_t* q, float dx, const int16_t*) {
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
                        int64_t isum = 0;
                        for (int j = 0; j < 16; ++j) {
                          int sub = 0;
                          for (int l = 0; l < 16; ++l) sub += v[16 * j + l] * q[16 * j + l];
                          isum += static_cast<int64_t>(b.scales[j]) * sub;
                        }
                        return fp16_to_f32(b.d) * dx * static_cast<float>(isum);
                      });
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
      return q4_k_kernel;
    case DType::kQ6_K:
      return q6_k_kernel;
    default:
      return nullptr;
  }
}

}  // namespace servetune::cpu::detail
