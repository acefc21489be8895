// The host side of the grouped expert GEMM (expert_gemm.cu): which expert_mlps calls it takes, the row tiles one
// launch covers (every active expert's rows, cut into tiles of 16 or 64), and the per-expert weight references the
// kernel reads. Plain C++ (no CUDA), so a CPU test (test_expert_gemm_plan) checks it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/mma_fragments.h"
#include "core/dtype.h"

namespace servetune::gpu {

constexpr int kExpertTileCols = 64;  // output columns a block computes
constexpr int kExpertTileK = 64;     // input columns per shared-memory stage
constexpr int kExpertSmemStride = kExpertTileK + 8;  // bf16 per shared row: padded by 16 bytes (bank groups)

// The block's warps over a tile_rows x 64 output tile: 16-row tiles take four warps, one over each 16 columns; 64-row
// tiles eight, a 4 x 2 grid of 16 x 32 (so the SwiGLU form's two accumulator sets and a stage's loads fit the
// registers). Warp w covers rows 16 (w / warps_n) and columns warp_cols * (w % warps_n) onwards.
SERVETUNE_MMA_HD constexpr int expert_threads(int tile_rows) { return tile_rows == 16 ? 128 : 256; }
SERVETUNE_MMA_HD constexpr int expert_warps_n(int tile_rows) { return expert_threads(tile_rows) / 32 / (tile_rows / 16); }
SERVETUNE_MMA_HD constexpr int expert_warp_cols(int tile_rows) { return kExpertTileCols / expert_warps_n(tile_rows); }

// Vector `idx` of a stage's loads: activations in float4s (tile row, stage column), weights in 16-byte vectors of
// `per` values (8 bf16 or 16 FP8 codes: weight row within the block's 64, stage column). Thread t loads vectors t,
// t + threads, ...
SERVETUNE_MMA_HD constexpr int stage_a_row(int idx) { return idx / (kExpertTileK / 4); }
SERVETUNE_MMA_HD constexpr int stage_a_col(int idx) { return 4 * (idx % (kExpertTileK / 4)); }
SERVETUNE_MMA_HD constexpr int stage_b_row(int idx, int per) { return idx / (kExpertTileK / per); }
SERVETUNE_MMA_HD constexpr int stage_b_col(int idx, int per) { return per * (idx % (kExpertTileK / per)); }

// Rows [row0, row0 + rows) of x and y, all of expert entry `entry` (an index into expert_mlps' span).
struct ExpertTile {
  int32_t entry = 0;
  int32_t rows = 0;
  int64_t row0 = 0;
};

// One expert's matrix as the kernel reads it: rows row_bytes apart; for kFP8_E4M3_B128 the scale of (row r, column c)
// at scales[(r + scale_row_offset) / 128 * scale_stride + c / 128] (BlockScales).
struct ExpertWeightRef {
  const void* data = nullptr;
  const float* scales = nullptr;
  int64_t row_bytes = 0;
  int64_t scale_stride = 0;
  int64_t scale_row_offset = 0;
};

inline ExpertWeightRef expert_weight_ref(const WeightMatrix& w) {
  return {w.data, w.scales.data, w.row_bytes, w.scales.stride, w.scales.row_offset};
}

// The kernel's reference layout for n experts (anything with gate, up and down matrix pointers): every gate, then
// every up, then every down, 3 * experts.size() entries at `refs`.
template <class Experts>
void write_expert_refs(const Experts& experts, ExpertWeightRef* refs) {
  const size_t n = std::size(experts);
  size_t i = 0;
  for (const auto& e : experts) {
    refs[i] = expert_weight_ref(*e.gate);
    refs[n + i] = expert_weight_ref(*e.up);
    refs[2 * n + i] = expert_weight_ref(*e.down);
    ++i;
  }
}

// Rows per tile for `rows` rows over `experts` experts: one m16 slice when they average fewer than 48 rows (decode
// steps: a few tokens on each of many experts, so a taller tile would be mostly padding), else 64 (prefill: each
// weight tile then serves four times the rows).
inline int expert_tile_rows(int64_t rows, int64_t experts) { return experts > 0 && rows >= 48 * experts ? 64 : 16; }
// The same over the active entries of an expert_mlps call.
inline int expert_tile_rows(std::span<const Backend::ExpertMlp> experts) {
  int64_t rows = 0, active = 0;
  for (const Backend::ExpertMlp& e : experts) {
    if (e.count <= 0) continue;
    rows += e.count;
    ++active;
  }
  return expert_tile_rows(rows, active);
}

// Every active entry's rows in order, cut into tiles of at most `tile_rows` rows (the last tile of an entry partial).
inline void plan_expert_tiles(std::span<const Backend::ExpertMlp> experts, int tile_rows, std::vector<ExpertTile>& tiles) {
  tiles.clear();
  for (size_t i = 0; i < experts.size(); ++i) {
    const Backend::ExpertMlp& e = experts[i];
    for (int64_t r = 0; r < e.count; r += tile_rows) {
      tiles.push_back({static_cast<int32_t>(i), static_cast<int32_t>(std::min<int64_t>(tile_rows, e.count - r)), e.first + r});
    }
  }
}

// Why the grouped kernel cannot run this expert_mlps call (x and y are the call's device pointers), or "" when it
// can: every active entry's gate and up share one type and shape, as do the downs; the types are bf16 or
// block-scaled FP8 (f32 weights keep cuBLAS's exact fp32 GEMMs); input widths (gate.cols, down.cols) are multiples
// of 16 and rows 16-byte aligned, so the kernel loads whole 16-byte vectors; entries are fewer than 2^31 rows.
inline std::string grouped_expert_problem(std::span<const Backend::ExpertMlp> experts, const void* x, const void* y) {
  const Backend::ExpertMlp* first = nullptr;
  for (const Backend::ExpertMlp& e : experts) {
    if (e.count > 0) {
      first = &e;
      break;
    }
  }
  if (first == nullptr) return "no expert has rows";
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const auto kernel_type = [](DType t) { return t == DType::kBF16 || t == DType::kFP8_E4M3_B128; };
  const auto same = [](const WeightMatrix& a, const WeightMatrix& b) {
    return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
  };
  const WeightMatrix &gate = *first->gate, &down = *first->down;
  if (!kernel_type(gate.type) || !kernel_type(down.type) || first->up->type != gate.type) {
    return "weights are " + std::string(dtype_name(gate.type)) + " / " + std::string(dtype_name(down.type)) +
           " (the kernel reads bf16 and block-scaled FP8)";
  }
  if (gate.cols % 16 != 0 || down.cols % 16 != 0) return "input widths are not multiples of 16";
  if (!aligned(x) || !aligned(y)) return "activations are not 16-byte aligned";
  for (const Backend::ExpertMlp& e : experts) {
    if (e.count <= 0) continue;
    if (e.count > INT32_MAX || e.first < 0) return "an entry's rows do not fit the tile plan";
    if (!same(*e.gate, gate) || !same(*e.up, gate) || !same(*e.down, down)) return "experts differ in type or shape";
    for (const WeightMatrix* w : {e.gate, e.up, e.down}) {
      if (!aligned(w->data) || w->row_bytes % 16 != 0) return "weight rows are not 16-byte aligned";
      if (w->type == DType::kFP8_E4M3_B128 && w->scales.data == nullptr) return "an FP8 matrix has no scales";
    }
  }
  return "";
}

}  // namespace servetune::gpu
