// The grouped expert GEMM (expert_gemm.cu): one launch multiplies every active expert's rows by that expert's matrix,
// the launcher over a tile plan (expert_gemm_plan.h) in device memory. CUDA only: the HIP build runs experts one GEMM
// at a time.
#pragma once

#include <cstdint>

#include "backend/cuda/expert_gemm_plan.h"
#include "backend/cuda/gpu_shim.h"

namespace servetune::gpu {

// For each tile t of `tiles` (n_tiles, device memory): rows [row0, row0 + rows) of y [*, n_cols] (f32) = the same
// rows of x [*, k] (f32, rounded to bf16) times the transpose of matrix a[tile.entry] ([n_cols, k], bf16, or
// block-scaled FP8 when `fp8`, dequantized to bf16 by its 128x128 scale), f32 accumulation. With `b` (the up
// projections, same type and shape as a's): y = silu(x . a^T) * (x . b^T), SwiGLU. tile_rows is 16 or 64, the
// plan's tile height. Rows of y outside the tiles are left alone. With `tile_count` (device memory) only the first
// *tile_count of the n_tiles run (a plan made on the device, n_tiles its bound). The HIP build throws
// Error(kUnsupported).
void launch_expert_gemm(const ExpertTile* tiles, int64_t n_tiles, const int32_t* tile_count, int tile_rows,
                        const ExpertWeightRef* a, const ExpertWeightRef* b, bool fp8, const float* x, int64_t k,
                        int64_t n_cols, float* y, cudaStream_t stream);

}  // namespace servetune::gpu
