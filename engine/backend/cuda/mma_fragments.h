// Index math of the tensor-core kernels (prefill_attention_mma.cu, expert_gemm.cu): which (row, col) of the A (16x16), B
// (16x8) and C/D (16x8) matrices element i of a lane holds in mma.sync.aligned.m16n8k16.row.col with f16/bf16 inputs and
// f32 accumulators (PTX ISA 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with floating point type"), the reuse of
// two C fragments as one A fragment (FlashAttention-2's P), the ldmatrix row addresses that load the A and B
// fragments, and the attention plan's tile rule. Plain functions: a CPU test (test_mma_fragments) checks them.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SERVETUNE_MMA_HD __host__ __device__
#else
#define SERVETUNE_MMA_HD
#endif

namespace servetune::gpu::mma {

// The ISA's groupID (lane >> 2) and threadID_in_group (lane % 4).
SERVETUNE_MMA_HD constexpr int group_id(int lane) { return lane >> 2; }
SERVETUNE_MMA_HD constexpr int thread_in_group(int lane) { return lane & 3; }

// A: a0..a7 in four 32-bit registers, register r holding a[2r] (low 16 bits) and a[2r + 1] (high). Rows groupID for
// a0, a1, a4, a5 and groupID + 8 otherwise; columns 2 * threadID_in_group + (i & 1), + 8 for i >= 4.
SERVETUNE_MMA_HD constexpr int a_row(int lane, int i) { return group_id(lane) + ((i & 2) != 0 ? 8 : 0); }
SERVETUNE_MMA_HD constexpr int a_col(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1) + ((i & 4) != 0 ? 8 : 0); }
// B (K x N = 16 x 8, "col": element (k, n) of a [n][k] row-major array): b0..b3 in two registers. Rows (k)
// 2 * threadID_in_group + (i & 1), + 8 for i >= 2; column (n) groupID.
SERVETUNE_MMA_HD constexpr int b_row(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1) + ((i & 2) != 0 ? 8 : 0); }
SERVETUNE_MMA_HD constexpr int b_col(int lane, int /*i*/) { return group_id(lane); }
// C/D (16 x 8, f32): c0..c3. Rows groupID for c0, c1 and groupID + 8 for c2, c3; columns 2 * threadID_in_group + (i & 1).
SERVETUNE_MMA_HD constexpr int c_row(int lane, int i) { return group_id(lane) + ((i & 2) != 0 ? 8 : 0); }
SERVETUNE_MMA_HD constexpr int c_col(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1); }

// FlashAttention-2's P: the A fragment of a 16 x 16 slice (columns 16 kk .. 16 kk + 15) of a 16-row score tile is made
// of the C fragments of its 8-column tiles 2 kk and 2 kk + 1 with no data movement between lanes: A element i comes
// from C tile 2 kk + (i >= 4) element i % 4 (same lane). Returns that C element index, and the tile offset in `tile`.
SERVETUNE_MMA_HD constexpr int a_from_c(int i, int& tile) {
  tile = i >= 4 ? 1 : 0;
  return i & 3;
}

// ldmatrix.sync.aligned.m8n8.x4 (PTX ISA 9.7.14.5.15): lanes 8 m .. 8 m + 7 give the addresses of rows 0..7 of 8x8
// b16 matrix m; lane L receives in register m the elements (L / 4, 2 (L % 4)) and (L / 4, 2 (L % 4) + 1) of matrix m,
// or with .trans (2 (L % 4), L / 4) and (2 (L % 4) + 1, L / 4). With K and V tiles stored [key][dim] in shared memory:
// - K (no .trans) gives the B fragments of S = Q K^T for 8 keys 8 nt.. and two k-steps s, s + 1: registers b0, b1 of
//   step s, then of s + 1, when lane L points at key 8 nt + ldsm_k_key(L), dim 16 s + ldsm_k_dim(L);
// - V (.trans) gives the B fragments of O = P V for 16 keys 16 kk.. and two 8-column tiles dt, dt + 1: b0, b1 of dt,
//   then of dt + 1, when lane L points at key 16 kk + ldsm_v_key(L), dim 8 dt + ldsm_v_dim(L).
// - A row-major [row][k] tile (no .trans) gives the A fragment of 16 rows and one k-step s (registers 0..3 = a0a1,
//   a2a3, a4a5, a6a7) when lane L points at row ldsm_a_row(L), column 16 s + ldsm_a_col(L) (expert_gemm.cu's
//   activations; its weights, stored [output][k] like K, load as K does).
SERVETUNE_MMA_HD constexpr int ldsm_a_row(int lane) { return lane & 15; }
SERVETUNE_MMA_HD constexpr int ldsm_a_col(int lane) { return 8 * (lane >> 4); }
SERVETUNE_MMA_HD constexpr int ldsm_k_key(int lane) { return lane & 7; }
SERVETUNE_MMA_HD constexpr int ldsm_k_dim(int lane) { return 8 * (lane >> 3); }
SERVETUNE_MMA_HD constexpr int ldsm_v_key(int lane) { return 8 * ((lane >> 3) & 1) + (lane & 7); }
SERVETUNE_MMA_HD constexpr int ldsm_v_dim(int lane) { return 8 * (lane >> 4); }

// The prefill plan's tiles: a tile is a run of batch tokens of one sequence whose positions share the window
// position / tile_tokens, so (positions ascending within a sequence) it holds at most tile_tokens tokens. Each block
// row is (token, query head of the GQA group): 64 rows hold 64 / group tokens.
constexpr int kTileRows = 64;
SERVETUNE_MMA_HD constexpr int tile_tokens(int group) { return group > 0 && group <= kTileRows ? kTileRows / group : 0; }
SERVETUNE_MMA_HD constexpr bool tile_starts(int64_t t, int32_t seq, int32_t prev_seq, int32_t pos, int32_t prev_pos,
                                            int tokens) {
  return t == 0 || seq != prev_seq || pos / tokens != prev_pos / tokens;
}

}  // namespace servetune::gpu::mma
