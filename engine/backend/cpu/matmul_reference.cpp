// Plain C++ matmul kernels: the numerics oracle (ggml-cpu x86 scheme, see matmul.h) and the dequantize-to-f32
// fallback for weight types without dedicated kernels. One output at a time, blocks summed in order.
#include <cmath>
#include <cstring>

#include "backend/cpu/matmul_internal.h"
#include "core/half.h"
#include "core/quant.h"

namespace servetune::cpu::detail {
namespace {

// ggml's x86 quantize_row_q8_0/q8_1: d = amax/127 (stored as f16), q = round-half-even(x * (127/amax)),
// s = f16(d * Σq) with the unrounded d.
void quantize_q8_reference(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                           int64_t q_stride, float* d, float* s, int64_t d_stride) {
  const int64_t nb = cols / kQBlock;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * x_stride;
    int8_t* qt = q + t * q_stride;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xt + b * kQBlock;
      float amax = 0.0f;
      for (int64_t j = 0; j < kQBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
      const float dd = amax / 127.0f;
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      for (int64_t j = 0; j < kQBlock; ++j) {
        float v = std::nearbyint(xb[j] * id);
        v = v > 127.0f ? 127.0f : (v < -128.0f ? -128.0f : v);
        const int qi = static_cast<int>(v);
        qt[b * kQBlock + j] = static_cast<int8_t>(qi);
        sum += qi;
      }
      d[t * d_stride + b] = fp16_to_f32(f32_to_fp16(dd));
      if (s != nullptr) s[t * d_stride + b] = fp16_to_f32(f32_to_fp16(dd * static_cast<float>(sum)));
    }
    std::memset(qt + cols, 0, static_cast<size_t>(q_stride - cols));
    for (int64_t b = nb; b < d_stride; ++b) {
      d[t * d_stride + b] = 0.0f;
      if (s != nullptr) s[t * d_stride + b] = 0.0f;
    }
  }
}

void round_f16_reference(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                         int64_t out_stride) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t c = 0; c < cols; ++c) out[t * out_stride + c] = fp16_to_f32(f32_to_fp16(x[t * x_stride + c]));
  }
}

void round_bf16_reference(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                          int64_t out_stride) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t c = 0; c < cols; ++c) out[t * out_stride + c] = bf16_to_f32(f32_to_bf16(x[t * x_stride + c]));
  }
}

template <class WeightAt>
void float_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                  int64_t y_stride, WeightAt weight_at) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = a.f + t * a.f_stride;
      float sum = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) sum += weight_at(row, c) * xt[c];
      y[t * y_stride + r] = sum;
    }
  }
}

void f32_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                int64_t y_stride) {
  float_kernel(w, a, r0, r1, t0, t1, y, y_stride, [](const uint8_t* row, int64_t c) {
    float v;
    std::memcpy(&v, row + c * 4, 4);
    return v;
  });
}

void f16_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                int64_t y_stride) {
  float_kernel(w, a, r0, r1, t0, t1, y, y_stride, [](const uint8_t* row, int64_t c) {
    uint16_t h;
    std::memcpy(&h, row + c * 2, 2);
    return fp16_to_f32(h);
  });
}

void bf16_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  float_kernel(w, a, r0, r1, t0, t1, y, y_stride, [](const uint8_t* row, int64_t c) {
    uint16_t h;
    std::memcpy(&h, row + c * 2, 2);
    return bf16_to_f32(h);
  });
}

// Sums d_w·d_x·isum(block) (+ m_w·s_x for Q4_1) over the blocks of one row and one token.
template <class Block, class BlockDot>
void quant_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                  int64_t y_stride, BlockDot block_dot) {
  const int64_t nb = a.nb;
  for (int64_t r = r0; r < r1; ++r) {
    Block blocks[1];
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int64_t t = t0; t < t1; ++t) {
      const int8_t* qt = a.q + t * a.q_stride;
      const float* dt = a.d + t * a.d_stride;
      const float* st = a.s != nullptr ? a.s + t * a.d_stride : nullptr;
      float sum = 0.0f;
      float min_sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        std::memcpy(blocks, row + b * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
        block_dot(blocks[0], qt + b * kQBlock, dt[b], st != nullptr ? st[b] : 0.0f, sum, min_sum);
      }
      y[t * y_stride + r] = sum + min_sum;
    }
  }
}

void q4_0_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  quant_kernel<BlockQ4_0>(w, a, r0, r1, t0, t1, y, y_stride,
                          [](const BlockQ4_0& b, const int8_t* q, float dx, float, float& sum, float&) {
                            int isum = 0;
                            for (int j = 0; j < 16; ++j) {
                              isum += ((b.qs[j] & 0x0F) - 8) * q[j] + ((b.qs[j] >> 4) - 8) * q[j + 16];
                            }
                            sum += (fp16_to_f32(b.d) * dx) * static_cast<float>(isum);
                          });
}

void q4_1_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  quant_kernel<BlockQ4_1>(w, a, r0, r1, t0, t1, y, y_stride,
                          [](const BlockQ4_1& b, const int8_t* q, float dx, float sx, float& sum, float& min_sum) {
                            int isum = 0;
                            for (int j = 0; j < 16; ++j) isum += (b.qs[j] & 0x0F) * q[j] + (b.qs[j] >> 4) * q[j + 16];
                            sum += (fp16_to_f32(b.d) * dx) * static_cast<float>(isum);
                            min_sum += fp16_to_f32(b.m) * sx;
                          });
}

void q8_0_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                 int64_t y_stride) {
  quant_kernel<BlockQ8_0>(w, a, r0, r1, t0, t1, y, y_stride,
                          [](const BlockQ8_0& b, const int8_t* q, float dx, float, float& sum, float&) {
                            int isum = 0;
                            for (int j = 0; j < 32; ++j) isum += b.qs[j] * q[j];
                            sum += (fp16_to_f32(b.d) * dx) * static_cast<float>(isum);
                          });
}

RangeKernel reference_kernel_for(DType type) {
  switch (type) {
    case DType::kF32:
      return f32_kernel;
    case DType::kF16:
      return f16_kernel;
    case DType::kBF16:
      return bf16_kernel;
    case DType::kQ4_0:
      return q4_0_kernel;
    case DType::kQ4_1:
      return q4_1_kernel;
    case DType::kQ8_0:
      return q8_0_kernel;
    default:
      return reference_k_kernel_for(type);
  }
}

}  // namespace

// Fallback for any type core/quant.h can dequantize: one weight row at a time to f32, then f32 dots.
void dequant_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                    int64_t y_stride) {
  auto* row = static_cast<float*>(thread_scratch(ScratchSlot::kDequant, static_cast<size_t>(w.cols) * sizeof(float)));
  for (int64_t r = r0; r < r1; ++r) {
    dequantize_row(w.type, w.data + r * w.row_bytes, row, w.cols);
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = a.f + t * a.f_stride;
      float sum = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) sum += row[c] * xt[c];
      y[t * y_stride + r] = sum;
    }
  }
}

const IsaKernels& reference_kernels() {
  static const IsaKernels kernels{quantize_q8_reference, quantize_q8k_reference, round_f16_reference,
                                  round_bf16_reference, reference_kernel_for};
  return kernels;
}

}  // namespace servetune::cpu::detail
