// Internal interface between the matmul driver (matmul.cpp) and the per-ISA kernel files (*_avx2.cpp, *_avx512.cpp).
// Declarations and plain structs only: ISA files must not instantiate inline code shared with baseline files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/background_prefetch.h"
#include "backend/cpu/matmul.h"

namespace servetune::cpu::detail {

constexpr int64_t kQBlock = 32;      // elements per Q8 activation block
constexpr int64_t kRowTile = 4;      // weight rows per micro-kernel tile (float / AVX2 kernels)
constexpr int64_t kRowChunk = 16;    // row chunks handed to threads are multiples of this
constexpr int64_t kTokenTile = 4;    // tokens per micro-kernel tile
constexpr int64_t kTokenGroup = 16;  // tokens per token-lane group; token chunks are multiples of this
constexpr int64_t kActAlign = 64;    // bytes; every activation row starts on a cache line
constexpr int64_t kFloatActCols = 32;  // rounded f16 / bf16 activation rows are padded to a multiple of this

// Activations prepared once per matmul call for all tokens. For quantized weights: q + t*q_stride holds the Q8
// quants of token t (natural element order, zero-padded to q_stride, a multiple of 64), d[t*d_stride + b] the block
// scale (the f16 value widened to f32) and, for Q8_1, s[t*d_stride + b] = f16(d·Σq) widened; d and s rows are
// zero-padded to d_stride (a multiple of 16). For float weights f + t*f_stride holds the (rounded) f32 activations
// (the AVX-512 BF16 kernel's in even/odd column order within each kFloatActCols block, as avx512_round_bf16 writes).
struct Activations {
  const int8_t* q = nullptr;
  int64_t q_stride = 0;
  const float* d = nullptr;
  const float* s = nullptr;
  int64_t nb = 0;
  int64_t d_stride = 0;
  const float* f = nullptr;
  int64_t f_stride = 0;
  // Q8_K (k-quant weights): q as above, d[t*d_stride + b] the f32 scale of 256-block b, bsums[t*bsum_stride + j]
  // the sum of quants j*16 .. j*16+15.
  const int16_t* bsums = nullptr;
  int64_t bsum_stride = 0;
  // Token-lane layout of the first n_groups*16 tokens (prefill, ISAs with pack_token_groups): group g holds at
  // xp + g*q_stride*16 the quads (4 consecutive quants) of its 16 tokens, quad-major (s8), and at
  // dt / st + g*d_stride*16 the block scales / Q8_1 sums, block-major (16 tokens per block).
  // For Q8_0 activations also nxs + g*d_stride*16: −Σ of each block's 32 quants, block-major (16 tokens per block;
  // the offset correction of signed weight codes). For Q8_K, dt holds the super-block scales and bst +
  // g*(bsum_stride/2)*16 the bsums in pairs, pair-major: the dword of pair p holds bsums 2p (low) and 2p + 1 (high).
  const int8_t* xp = nullptr;
  const float* dt = nullptr;
  const float* st = nullptr;
  const int32_t* nxs = nullptr;
  const int32_t* bst = nullptr;
  int64_t n_groups = 0;
  // The calling thread's share of memory to fetch for a later operation while the tiles compute (may be null).
  PrefetchCursor* background = nullptr;
};

// Weights as the kernels see them.
struct Weights {
  const uint8_t* data;
  DType type;
  int64_t rows;
  int64_t cols;
  int64_t row_bytes;
  BlockScales scales;  // kFP8_E4M3_B128 only
};

// How activations must be prepared for a weight type.
enum class ActKind { kF32, kF16Rounded, kBF16Rounded, kQ8_0, kQ8_1, kQ8_K, kDequantF32 };
ActKind act_kind(DType weight_type);

// Computes y[t*y_stride + r] for r in [r0, r1), t in [t0, t1). r0 is a multiple of kRowChunk, t0 of kTokenGroup.
using RangeKernel = void (*)(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                             float* y, int64_t y_stride);
// Quantizes tokens [t0, t1) of x into q/d/s laid out as in Activations, padding included; s may be null (Q8_0).
using QuantizeFn = void (*)(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                            int64_t q_stride, float* d, float* s, int64_t d_stride);

// Rounds tokens [t0, t1) of x to f16 or bf16 precision (round-to-nearest-even), written back widened to f32.
using RoundFn = void (*)(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                         int64_t out_stride);

// ggml's quantize_row_q8_K_ref for tokens [t0, t1): per 256-block d = max/-127 (max = the element of largest |x|),
// q = min(127, round-half-even(x * -127/max)), bsums per 16.
using QuantizeKFn = void (*)(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                             int64_t q_stride, float* d, int64_t d_stride, int16_t* bsums, int64_t bsum_stride);

// Builds the token-lane layout of groups [g0, g1) from the quantized activations in `a` (st, nxs, bst: null when the
// scheme has none).
using PackFn = void (*)(const Activations& a, int64_t g0, int64_t g1, int8_t* xp, float* dt, float* st, int32_t* nxs,
                        int32_t* bst);

struct IsaKernels {
  QuantizeFn quantize_q8;
  QuantizeKFn quantize_q8k;
  RoundFn round_f16;
  RoundFn round_bf16;
  RangeKernel (*kernel_for)(DType weight_type);  // nullptr: use the generic fallback
  PackFn pack_token_groups;                      // nullptr: the ISA has no token-lane kernels
};

const IsaKernels& reference_kernels();
// Pieces of the ISA tables that live in separate files.
void quantize_q8k_reference(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                            int64_t q_stride, float* d, int64_t d_stride, int16_t* bsums, int64_t bsum_stride);
RangeKernel reference_k_kernel_for(DType weight_type);
void avx512_quantize_q8(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                        int64_t q_stride, float* d, float* s, int64_t d_stride);
void avx512_quantize_q8k(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                         int64_t q_stride, float* d, int64_t d_stride, int16_t* bsums, int64_t bsum_stride);
RangeKernel avx512_k_kernel_for(DType weight_type);
// Token-lane GEMM of Q4_K / Q5_K / Q6_K rows [r0, r1) for token groups [g0, g1).
void avx512_k_tl_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1,
                       float* y, int64_t y_stride);
void avx512_pack_token_groups(const Activations& a, int64_t g0, int64_t g1, int8_t* xp, float* dt, float* st,
                              int32_t* nxs, int32_t* bst);
// Token-lane GEMM of Q4_0 / Q4_1 / Q8_0 rows [r0, r1) for token groups [g0, g1) (tokens 16*g0 .. 16*g1).
void avx512_tl_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                     int64_t y_stride);
RangeKernel avx512_float_kernel_for(DType weight_type);
// Block-scaled FP8 (kFP8_E4M3_B128) rows [r0, r1) × tokens [t0, t1) over f32 activations.
void avx512_fp8_block_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                            float* y, int64_t y_stride);
void avx2_fp8_block_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                          float* y, int64_t y_stride);
void avx512_round_f16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                      int64_t out_stride);
void avx512_round_bf16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                       int64_t out_stride);
void avx2_pack_token_groups(const Activations& a, int64_t g0, int64_t g1, int8_t* xp, float* dt, float* st,
                            int32_t* nxs, int32_t* bst);
// Token-lane GEMM of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 rows [r0, r1) for token groups [g0, g1).
void avx2_tl_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                   int64_t y_stride);
void avx2_quantize_q8k(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, int8_t* q,
                       int64_t q_stride, float* d, int64_t d_stride, int16_t* bsums, int64_t bsum_stride);
RangeKernel avx2_k_kernel_for(DType weight_type);
// Token-lane GEMM of Q4_K / Q5_K / Q6_K rows [r0, r1) for token groups [g0, g1).
void avx2_k_tl_range(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t g0, int64_t g1, float* y,
                     int64_t y_stride);
RangeKernel avx2_float_kernel_for(DType weight_type);
void avx2_round_f16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                    int64_t out_stride);
void avx2_round_bf16(const float* x, int64_t x_stride, int64_t t0, int64_t t1, int64_t cols, float* out,
                     int64_t out_stride);
// Dequantize-to-f32 fallback (activations kDequantF32) for types core/quant.h can dequantize; any ISA.
void dequant_kernel(const Weights& w, const Activations& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* y,
                    int64_t y_stride);
const IsaKernels& avx2_kernels();
const IsaKernels& avx512_kernels();

// Per-thread scratch owned by the baseline driver (so ISA files allocate nothing themselves). 64-byte aligned; valid
// until the next call on the same thread with the same slot.
enum class ScratchSlot { kActivations = 0, kPanel = 1, kDequant = 2, kTokenLanePanel = 3, kSwiglu = 4 };
void* thread_scratch(ScratchSlot slot, size_t bytes);

}  // namespace servetune::cpu::detail
