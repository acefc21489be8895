// Plain C++ matmul kernels: the numerics oracle (ggml-cpu x86 scheme, see matmul.h) and the dequantize-to-f32
// fallback for weight types without dedicated kernels. Quantized types use the canonical 8-lane arithmetic below.
#include <cmath>
#include <cstring>
#include <type_traits>

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

// One weight block as 32 integer quants in element order, its scale d and (Q4_1, Q5_1) min m.
struct DecodedBlock {
  int q[32];
  float d;
  float m;
};

// Fifth bits of a Q5 block: element j (0..31) gets bit j of qh as its value 16.
int q5_high(const uint8_t* qh, int j) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  return static_cast<int>((bits >> j) & 1u) << 4;
}

template <DType kType>
DecodedBlock decode_block(const uint8_t* src) {
  DecodedBlock out{};
  if constexpr (kType == DType::kQ8_0) {
    BlockQ8_0 b;
    std::memcpy(&b, src, sizeof b);
    for (int j = 0; j < 32; ++j) out.q[j] = b.qs[j];
    out.d = fp16_to_f32(b.d);
  } else if constexpr (kType == DType::kQ4_0 || kType == DType::kQ4_1) {
    using Block = std::conditional_t<kType == DType::kQ4_0, BlockQ4_0, BlockQ4_1>;
    Block b;
    std::memcpy(&b, src, sizeof b);
    const int offset = kType == DType::kQ4_0 ? 8 : 0;
    for (int j = 0; j < 16; ++j) {
      out.q[j] = (b.qs[j] & 0x0F) - offset;
      out.q[j + 16] = (b.qs[j] >> 4) - offset;
    }
    out.d = fp16_to_f32(b.d);
    if constexpr (kType == DType::kQ4_1) out.m = fp16_to_f32(b.m);
  } else {
    using Block = std::conditional_t<kType == DType::kQ5_0, BlockQ5_0, BlockQ5_1>;
    Block b;
    std::memcpy(&b, src, sizeof b);
    const int offset = kType == DType::kQ5_0 ? 16 : 0;
    for (int j = 0; j < 16; ++j) {
      out.q[j] = ((b.qs[j] & 0x0F) | q5_high(b.qh, j)) - offset;
      out.q[j + 16] = ((b.qs[j] >> 4) | q5_high(b.qh, j + 16)) - offset;
    }
    out.d = fp16_to_f32(b.d);
    if constexpr (kType == DType::kQ5_1) out.m = fp16_to_f32(b.m);
  }
  return out;
}

// The canonical arithmetic of every quantized kernel: per block the exact integer dot Σ_{32} q_w·q_x, then one f32
// accumulator in block order, acc = fma(d_w·d_x, float(isum), acc); for Q4_1 / Q5_1 the mins as a second chain
// mins = fma(m_w, s_x, mins); the result acc + mins. One rounding per block (ggml's x86 vec_dot rounds per 4-element
// quad into eight lanes); the integer sums let the batched kernels spend one float op per block instead of eight.
template <DType kType>
void quant_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                  int64_t y_stride) {
  constexpr bool kHasMin = kType == DType::kQ4_1 || kType == DType::kQ5_1;
  const int64_t block_bytes = dtype_info(kType).type_size;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int64_t t = t0; t < t1; ++t) {
      const int8_t* qt = a.q + t * a.q_stride;
      float acc = 0.0f;
      float mins = 0.0f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const DecodedBlock blk = decode_block<kType>(row + b * block_bytes);
        const float d = blk.d * a.d[t * a.d_stride + b];
        if constexpr (kHasMin) mins = std::fma(blk.m, a.s[t * a.d_stride + b], mins);
        int isum = 0;
        for (int j = 0; j < kQBlock; ++j) isum += blk.q[j] * qt[b * kQBlock + j];
        acc = std::fma(d, static_cast<float>(isum), acc);
      }
      y[t * y_stride + r] = kHasMin ? acc + mins : acc;
    }
  }
}

// Block-scaled FP8: each row dequantized (dequantize_fp8_block_row), then the F32 kernel's sum.
void fp8_block_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                      int64_t y_stride) {
  auto* row = static_cast<float*>(thread_scratch(ScratchSlot::kDequant, static_cast<size_t>(w.cols) * sizeof(float)));
  for (int64_t r = r0; r < r1; ++r) {
    dequantize_fp8_block_row(w.data + r * w.row_bytes, w.scales.row(r), row, w.cols);
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = a.f + t * a.f_stride;
      float sum = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) sum += row[c] * xt[c];
      y[t * y_stride + r] = sum;
    }
  }
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
      return quant_kernel<DType::kQ4_0>;
    case DType::kQ4_1:
      return quant_kernel<DType::kQ4_1>;
    case DType::kQ5_0:
      return quant_kernel<DType::kQ5_0>;
    case DType::kQ5_1:
      return quant_kernel<DType::kQ5_1>;
    case DType::kQ8_0:
      return quant_kernel<DType::kQ8_0>;
    case DType::kFP8_E4M3_B128:
      return fp8_block_kernel;
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
                                  round_bf16_reference,  reference_kernel_for,   nullptr};
  return kernels;
}

}  // namespace servetune::cpu::detail
