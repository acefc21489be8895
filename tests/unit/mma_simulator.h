// A CPU model of one warp's mma.sync m16n8k16 and ldmatrix.x4 (PTX ISA semantics, f32 values standing in for
// bf16/f16), for tests that walk a tensor-core kernel's fragment addressing (test_mma_fragments, test_expert_gemm_plan).
#pragma once

#include <array>
#include <utility>
#include <vector>

#include "backend/cuda/mma_fragments.h"

namespace servetune::gpu::mma {

// A simulated warp mma: each lane's registers of A (8), B (4) and C/D (4) as the layouts place them.
using AFrag = std::array<std::array<float, 8>, 32>;
using BFrag = std::array<std::array<float, 4>, 32>;
using CFrag = std::array<std::array<float, 4>, 32>;
inline void simulated_mma(const AFrag& a, const BFrag& b, CFrag& d) {
  float am[16][16], bm[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) am[a_row(lane, i)][a_col(lane, i)] = a[lane][i];
    for (int i = 0; i < 4; ++i) bm[b_row(lane, i)][b_col(lane, i)] = b[lane][i];
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      float sum = 0.0f;
      for (int k = 0; k < 16; ++k) sum += am[c_row(lane, i)][k] * bm[k][c_col(lane, i)];
      d[lane][i] += sum;
    }
  }
}

// ldmatrix.x4 as the ISA defines it, over a row-major [rows][cols] array: lanes 8 m .. 8 m + 7 give (row, col) starts
// of matrix m's rows; lane L's register m gets two elements of matrix m, (L / 4, 2 (L % 4) + e), or transposed.
inline std::array<std::array<std::array<float, 2>, 4>, 32> simulated_ldmatrix(const std::vector<float>& a, int cols, bool trans,
                                                                       const std::array<std::pair<int, int>, 32>& starts) {
  std::array<std::array<std::array<float, 2>, 4>, 32> regs{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int m = 0; m < 4; ++m) {
      for (int e = 0; e < 2; ++e) {
        const int r = trans ? 2 * (lane % 4) + e : lane / 4, c = trans ? lane / 4 : 2 * (lane % 4) + e;
        const auto [row, col] = starts[8 * m + r];
        regs[lane][m][e] = a[row * cols + col + c];
      }
    }
  }
  return regs;
}

}  // namespace servetune::gpu::mma
