// CPU matrix multiplication y = x · Wᵀ for f32 activations and F32/F16/BF16/GGML-quantized weights, following
// ggml-cpu's activation quantization (Q8_0/Q8_1 per 32-block) with exact integer block dots, so outputs stay within
// rounding of llama.cpp's. Runtime-dispatched to AVX-512 VNNI / AVX2 / plain C++ kernels.
#pragma once

#include <cstdint>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace servetune::cpu {

class BackgroundPrefetch;

// A weight matrix W with `rows` output features and `cols` input features; rows are contiguous, `row_bytes` apart,
// in GGML block layout for quantized types (row_bytes >= dtype_row_bytes(type, cols)). `scales`: those of a
// kFP8_E4M3_B128 matrix (core/dtype.h), unused for other types.
struct MatrixView {
  const void* data;
  DType type;
  int64_t rows;
  int64_t cols;
  int64_t row_bytes;
  BlockScales scales;
};

// Numerics per weight type (what ggml-cpu on x86 does):
//   F32         f32 dot.
//   F16, BF16   activations rounded to f16 / bf16 (round-to-nearest-even), then exact products summed in f32.
//   Q4_0, Q5_0, Q8_0, Q4_1, Q5_1
//               activations quantized per 32-block as ggml's x86 quantize_row_q8_0 (Q4_1, Q5_1: _q8_1, which adds
//               s = f16(d·Σq)): d = amax/127 stored as f16, q = round-half-even(x·127/amax). Each output is then
//               acc = fma(d_w·d_x, float(Σ_{32} q_w·q_x), acc) block by block (the integer dot is exact), mins as
//               an fma chain of m_w·s_x, result acc (+ mins). ggml's x86 vec_dot rounds per 4-element quad into
//               eight lanes instead: the two differ by f32 rounding only (the quantized inputs are identical), and
//               one float op per block instead of eight is what lets batched matmuls run at the integer rate.
//   Q4_K, Q5_K, Q6_K
//               activations quantized per 256-block to Q8_K as ggml's quantize_row_q8_K_ref (f32 d = max/−127,
//               q = round-half-even(x·−127/max), bsums per 16). Per super-block the exact integer sums with the
//               sub-block scales, isum = Σ scale·Σ q_w·q_x (Q6_K's codes − 32) and, for Q4_K / Q5_K, msum =
//               Σ min·bsum; then acc = fma(d_w·d_x, float(isum), acc), mins = fma(dmin_w·d_x, float(msum), mins),
//               result acc − mins. ggml's x86 vec_dot rounds per vector lane instead: close, not bit-exact.
//   FP8_E4M3_B128
//               each weight dequantized as core/quant.h's dequantize_fp8_block_row does (e4m3 value times its block's
//               f32 scale, one rounding) inside the kernel, then the F32 kernel's arithmetic: the result equals the
//               F32 matmul of the dequantized matrix on the same ISA bit for bit. The weights stay one byte each in
//               memory (decode reads a quarter of the f32 bytes); batched tiles dequantize a few rows once into
//               scratch and reuse them for every token.
//   other types that core/quant.h can dequantize: weights dequantized to f32, then f32 dot (slow fallback; note
//               ggml would quantize activations to Q8_0/Q8_1/Q8_K for these, so results are close, not identical).
// An output's value never depends on the batch it is computed in (other tokens, its position, the batch size) or
// on the thread count: the engine's greedy output is the same alone or batched. The quantized kernels equal
// matmul_reference bit for bit; the float kernels differ from it only in summation order.
// Paths (AVX-512, quantized): whole groups of 16 tokens → token-lane VNNI GEMM (prefill, batched decode); other
// tokens → row-lane kernel over 16-row panels decoded to quad-major order, next panel prefetched (decode).
// Paths (AVX2, quantized): whole groups of 16 tokens → token-lane vpmaddubsw GEMM; other tokens → row octets read in
// place (eight rows as the lanes of one vector).
// The k-quants split the same way on both ISAs: token-lane GEMMs that scale each sub-block's exact sums (vpmulld /
// vpmaddwd), and rows decoded in place whose partial sums a tree of adds reduces to a lane per row (16-row panels on
// AVX-512, octets on AVX2), so every path spends one fma per super-block, row and token.
bool matmul_supports(DType weight_type);

// y[t*y_stride + r] = Σ_c x[t*x_stride + c] * W[r, c]   for t < n_tokens, r < rows. y must not overlap x or W.
// Throws Error(kUnsupported) for weight types matmul_supports rejects, Error(kUsage) for inconsistent shapes.
// Not re-entrant per thread (per-thread scratch); concurrent calls on different pools from different threads are fine.
// With `background`, batched tiles also walk its ranges (background_prefetch.h); results are the same.
void matmul(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y, int64_t y_stride,
            ThreadPool& pool, BackgroundPrefetch* background = nullptr);

// Several matrices applied to the same activations (Q/K/V, gate/up) in one parallel region with one activation
// preparation: saves a pool wake-up and a quantization per extra matrix. All must have the same cols and activation
// scheme (act_kind: e.g. all Q4_1, or Q4_0 mixed with Q8_0). Results equal separate matmul calls bit for bit.
// True when matrices of these weight types can share one matmul_multi call (the same activation scheme).
bool matmul_shares_activations(DType a, DType b);
struct MatmulTarget {
  MatrixView w;
  float* y;
  int64_t y_stride;
};
void matmul_multi(const MatmulTarget* targets, int n_targets, const float* x, int64_t n_tokens, int64_t x_stride,
                  ThreadPool& pool, BackgroundPrefetch* background = nullptr);

// y = (silu(gate) ⊙ up) · Wᵀ, the SwiGLU rows made a few tokens at a time inside the matmul's activation preparation
// by `silu_mul` (pass the kernel a separate silu_mul op would use: the result then equals that op followed by
// matmul() bit for bit) instead of being written to memory and read back. gate and up rows are in_stride apart.
// `rows` (n_tokens x W.cols floats) receives the SwiGLU rows only for weight types whose kernels read f32 rows.
using SiluMulKernel = void (*)(const float* gate, const float* up, int64_t in_stride, int64_t n, int64_t ffn,
                               float* out);
struct SwigluInput {
  const float* gate;
  const float* up;
  int64_t in_stride;
  SiluMulKernel silu_mul;
};
void matmul_swiglu(const MatrixView& w, const SwigluInput& in, int64_t n_tokens, float* rows, float* y,
                   int64_t y_stride, ThreadPool& pool, BackgroundPrefetch* background = nullptr);

// Plain C++ oracle with the same numerics contract, single-threaded.
void matmul_reference(const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
                      int64_t y_stride);

// matmul with the kernels of one ISA level (for tests and benchmarks); Error(kUsage) when the CPU lacks it.
// matmul() uses cpu_selected_isa(), which honours SERVETUNE_CPU_ISA.
void matmul_with_isa(CpuIsa isa, const MatrixView& w, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
                     int64_t y_stride, ThreadPool& pool);

// The per-32-block activation quantization of the quantized kernels, for tests: quantizes one row of n activations
// (n a multiple of 32) with the given ISA's quantizer into q (n int8), d (n/32 block scales, f16 values widened to
// f32) and, when s is not null, s (n/32 Q8_1 sums f16(d·Σq), widened). All ISAs must agree bit for bit.
void quantize_activations(CpuIsa isa, const float* x, int64_t n, int8_t* q, float* d, float* s);
// The same for the Q8_K scheme of the k-quant kernels (n a multiple of 256): q (n int8), d (n/256 f32 scales),
// bsums (n/16 sums of 16 quants).
void quantize_activations_q8k(CpuIsa isa, const float* x, int64_t n, int8_t* q, float* d, int16_t* bsums);

}  // namespace servetune::cpu
