// The grouped expert GEMM's host side and index math (backend/cuda/expert_gemm_plan.h) on the CPU: the tile plan covers
// every active expert's rows once in tiles of at most 16 or 64 rows, the tile height follows rows per expert, the
// calls the kernel cannot take are named, and one block of the kernel, walked as expert_gemm.cu addresses it (stage
// loads into shared rows, ldmatrix, mma per warp, the epilogue's writes; through the simulated warp of
// mma_simulator.h), computes the plain product of its rows by the expert's matrix for 16- and 64-row tiles, bf16 and
// FP8-vector staging, with partial row, column and K tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/expert_gemm_plan.h"
#include "core/half.h"
#include "mma_simulator.h"

namespace servetune::gpu {
namespace {

using Mlp = Backend::ExpertMlp;

TEST(ExpertGemmPlan, TilesCoverEveryActiveRowOnce) {
  WeightMatrix w{};
  const int64_t counts[] = {0, 1, 17, 23, 64, 65, 130, 0};
  std::vector<Mlp> experts;
  int64_t first = 5;  // entries need not start at row 0
  for (int64_t c : counts) {
    experts.push_back({&w, &w, &w, first, c});
    first += c;
  }
  for (int tile_rows : {16, 64}) {
    std::vector<ExpertTile> tiles;
    plan_expert_tiles(experts, tile_rows, tiles);
    std::vector<int> seen(static_cast<size_t>(first), 0);
    for (const ExpertTile& t : tiles) {
      ASSERT_GE(t.entry, 0);
      ASSERT_LT(t.entry, static_cast<int32_t>(experts.size()));
      const Mlp& e = experts[static_cast<size_t>(t.entry)];
      EXPECT_GE(t.rows, 1);
      EXPECT_LE(t.rows, tile_rows);
      EXPECT_GE(t.row0, e.first);
      EXPECT_LE(t.row0 + t.rows, e.first + e.count);
      for (int64_t r = t.row0; r < t.row0 + t.rows; ++r) ++seen[static_cast<size_t>(r)];
    }
    for (int64_t r = 5; r < first; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << "row " << r << ", tiles of " << tile_rows;
    int64_t fewest = 0;
    for (int64_t c : counts) fewest += (c + tile_rows - 1) / tile_rows;
    EXPECT_EQ(static_cast<int64_t>(tiles.size()), fewest);
  }
}

TEST(ExpertGemmPlan, TileHeightFollowsRowsPerActiveExpert) {
  WeightMatrix w{};
  const auto rows_with = [&](std::vector<int64_t> counts) {
    std::vector<Mlp> experts;
    for (int64_t c : counts) experts.push_back({&w, &w, &w, 0, c});
    return expert_tile_rows(experts);
  };
  EXPECT_EQ(rows_with(std::vector<int64_t>(256, 2)), 16);   // a decode step of 64 tokens, top-8 of 256 experts
  EXPECT_EQ(rows_with(std::vector<int64_t>(256, 64)), 64);  // a 2048-token prefill chunk
  EXPECT_EQ(rows_with({47, 0, 0, 47}), 16);                 // empty experts do not count
  EXPECT_EQ(rows_with({48, 0, 0, 48}), 64);
  EXPECT_EQ(rows_with({0, 0}), 16);
  EXPECT_EQ(rows_with({}), 16);
}

TEST(ExpertGemmPlan, CallsTheKernelCannotTakeAreNamed) {
  alignas(16) static float buffer[64];
  const float scales[1] = {1.0f};
  const auto matrix = [&](DType type, int64_t rows, int64_t cols) {
    const int64_t elem = type == DType::kF32 ? 4 : type == DType::kBF16 ? 2 : 1;
    WeightMatrix m{buffer, type, rows, cols, cols * elem, {}};
    if (type == DType::kFP8_E4M3_B128) m.scales = BlockScales{scales, 4, 0};
    return m;
  };
  const WeightMatrix gate = matrix(DType::kBF16, 32, 64), down = matrix(DType::kBF16, 64, 32);
  const float* x = buffer;
  float* y = buffer;
  EXPECT_EQ(grouped_expert_problem(std::vector<Mlp>{{&gate, &gate, &down, 0, 3}}, x, y), "");
  // An empty entry of any type is never read.
  const WeightMatrix f32 = matrix(DType::kF32, 32, 64);
  EXPECT_EQ(grouped_expert_problem(std::vector<Mlp>{{&f32, &f32, &f32, 0, 0}, {&gate, &gate, &down, 0, 3}}, x, y), "");
  const WeightMatrix fp8_gate = matrix(DType::kFP8_E4M3_B128, 32, 64), fp8_down = matrix(DType::kFP8_E4M3_B128, 64, 32);
  EXPECT_EQ(grouped_expert_problem(std::vector<Mlp>{{&fp8_gate, &fp8_gate, &fp8_down, 0, 3}}, x, y), "");
  EXPECT_EQ(grouped_expert_problem(std::vector<Mlp>{{&fp8_gate, &fp8_gate, &down, 0, 3}}, x, y), "");  // mixed projections

  EXPECT_NE(grouped_expert_problem(std::vector<Mlp>{{&gate, &gate, &down, 0, 0}}, x, y), "");
  EXPECT_NE(grouped_expert_problem(std::vector<Mlp>{{&f32, &f32, &f32, 0, 3}}, x, y).find("F32"), std::string::npos);
  EXPECT_NE(grouped_expert_problem(std::vector<Mlp>{{&gate, &fp8_gate, &down, 0, 3}}, x, y), "");  // gate and up differ
  const WeightMatrix other = matrix(DType::kBF16, 48, 64);
  EXPECT_NE(grouped_expert_problem(std::vector<Mlp>{{&gate, &gate, &down, 0, 3}, {&other, &other, &down, 3, 1}}, x, y), "");
  const WeightMatrix narrow = matrix(DType::kBF16, 32, 40);
  EXPECT_NE(grouped_expert_problem(std::vector<Mlp>{{&narrow, &narrow, &down, 0, 3}}, x, y).find("16"), std::string::npos);
  EXPECT_NE(grouped_expert_problem(std::vector<Mlp>{{&gate, &gate, &down, 0, 3}}, x + 1, y).find("aligned"), std::string::npos);
  WeightMatrix unaligned = gate;
  unaligned.data = buffer + 2;
  EXPECT_NE(grouped_expert_problem(std::vector<Mlp>{{&unaligned, &unaligned, &down, 0, 3}}, x, y), "");
  WeightMatrix no_scales = fp8_gate;
  no_scales.scales = {};
  EXPECT_NE(grouped_expert_problem(std::vector<Mlp>{{&no_scales, &no_scales, &fp8_down, 0, 3}}, x, y).find("scales"),
            std::string::npos);
}

// One block (tile of `rows` rows, output columns n0 .. n0 + 63) walked as the kernel does. Values are f32 standing in
// for the bf16 the kernel stages; `per` is the weight vector width (8: bf16, 16: FP8 codes), which only changes how
// the stage's loads are cut.
void walk_block(int tile_rows, int per, const std::vector<float>& x, int rows, const std::vector<float>& w, int64_t n_cols,
                int64_t k, int64_t n0, std::vector<float>& y, std::vector<int>& writes) {
  const int stride = kExpertSmemStride, threads = expert_threads(tile_rows);
  ASSERT_EQ(tile_rows * (kExpertTileK / 4) % threads, 0);
  ASSERT_EQ(kExpertTileCols * kExpertTileK / per % threads, 0);
  const int warps = threads / 32, warps_n = expert_warps_n(tile_rows), warp_cols = expert_warp_cols(tile_rows);
  ASSERT_EQ(warps / warps_n * 16, tile_rows);
  std::vector<float> as(static_cast<size_t>(tile_rows * stride)), bs(static_cast<size_t>(kExpertTileCols * stride));
  std::vector<std::vector<mma::CFrag>> acc(static_cast<size_t>(warps),
                                           std::vector<mma::CFrag>(static_cast<size_t>(warp_cols / 8), mma::CFrag{}));
  for (int64_t k0 = 0; k0 < k; k0 += kExpertTileK) {
    for (int idx = 0; idx < tile_rows * kExpertTileK / 4; ++idx) {
      const int r = stage_a_row(idx), c = stage_a_col(idx);
      for (int j = 0; j < 4; ++j) {
        const bool in = r < rows && k0 + c < k;
        as[static_cast<size_t>(r * stride + c + j)] = in ? x[static_cast<size_t>(r * k + k0 + c + j)] : 0.0f;
      }
    }
    for (int idx = 0; idx < kExpertTileCols * kExpertTileK / per; ++idx) {
      const int r = stage_b_row(idx, per), c = stage_b_col(idx, per);
      for (int j = 0; j < per; ++j) {
        const bool in = n0 + r < n_cols && k0 + c < k;
        bs[static_cast<size_t>(r * stride + c + j)] = in ? w[static_cast<size_t>((n0 + r) * k + k0 + c + j)] : 0.0f;
      }
    }
    for (int warp = 0; warp < warps; ++warp) {
      const int wm = warp / warps_n, wn = warp % warps_n;
      for (int s = 0; s < kExpertTileK / 16; s += 2) {
        mma::AFrag a[2];
        for (int step = 0; step < 2; ++step) {
          std::array<std::pair<int, int>, 32> starts;
          for (int lane = 0; lane < 32; ++lane) {
            starts[lane] = {16 * wm + mma::ldsm_a_row(lane), 16 * (s + step) + mma::ldsm_a_col(lane)};
          }
          const auto regs = mma::simulated_ldmatrix(as, stride, false, starts);
          for (int lane = 0; lane < 32; ++lane) {
            for (int i = 0; i < 8; ++i) a[step][lane][i] = regs[lane][i / 2][i % 2];
          }
        }
        for (int nt = 0; nt < warp_cols / 8; ++nt) {
          std::array<std::pair<int, int>, 32> starts;
          for (int lane = 0; lane < 32; ++lane) {
            starts[lane] = {warp_cols * wn + 8 * nt + mma::ldsm_k_key(lane), 16 * s + mma::ldsm_k_dim(lane)};
          }
          const auto regs = mma::simulated_ldmatrix(bs, stride, false, starts);
          mma::BFrag b[2];
          for (int lane = 0; lane < 32; ++lane) {
            for (int i = 0; i < 4; ++i) {
              b[0][lane][i] = regs[lane][i / 2][i % 2];
              b[1][lane][i] = regs[lane][2 + i / 2][i % 2];
            }
          }
          mma::simulated_mma(a[0], b[0], acc[static_cast<size_t>(warp)][static_cast<size_t>(nt)]);
          mma::simulated_mma(a[1], b[1], acc[static_cast<size_t>(warp)][static_cast<size_t>(nt)]);
        }
      }
    }
  }
  for (int warp = 0; warp < warps; ++warp) {
    const int wm = warp / warps_n, wn = warp % warps_n;
    for (int nt = 0; nt < warp_cols / 8; ++nt) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i) {
          const int r = 16 * wm + mma::c_row(lane, i);
          const int64_t col = n0 + warp_cols * wn + 8 * nt + mma::c_col(lane, i);
          if (r >= rows || col >= n_cols) continue;
          y[static_cast<size_t>(r * n_cols + col)] = acc[static_cast<size_t>(warp)][static_cast<size_t>(nt)][lane][i];
          ++writes[static_cast<size_t>(r * n_cols + col)];
        }
      }
    }
  }
}

TEST(ExpertGemmPlan, OneBlockWalkedAsTheKernelIsThePlainProduct) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  // K = 80: one whole 64-column stage and a partial one; 70 output columns: a whole block and a partial one.
  const int64_t k = 80, n_cols = 70;
  for (int tile_rows : {16, 64}) {
    for (int per : {8, 16}) {
      for (int rows : {1, tile_rows - 3, tile_rows}) {
        SCOPED_TRACE("tile " + std::to_string(tile_rows) + " rows " + std::to_string(rows) + " vector " + std::to_string(per));
        std::vector<float> x(static_cast<size_t>(rows * k)), w(static_cast<size_t>(n_cols * k));
        // bf16 values, as the kernel multiplies: FP8 codes times a per-128-block scale, rounded to bf16.
        for (float& v : x) v = bf16_to_f32(f32_to_bf16(dist(rng)));
        for (float& v : w) v = bf16_to_f32(f32_to_bf16(fp8_e4m3_to_f32(f32_to_fp8_e4m3(dist(rng) * 8.0f)) * 0.37f));
        std::vector<float> y(static_cast<size_t>(rows * n_cols), NAN);
        std::vector<int> writes(y.size(), 0);
        for (int64_t n0 = 0; n0 < n_cols; n0 += kExpertTileCols) {
          walk_block(tile_rows, per, x, rows, w, n_cols, k, n0, y, writes);
        }
        for (int r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < n_cols; ++c) {
            double want = 0.0;
            for (int64_t j = 0; j < k; ++j) {
              want += static_cast<double>(x[static_cast<size_t>(r * k + j)]) * w[static_cast<size_t>(c * k + j)];
            }
            const size_t at = static_cast<size_t>(r * n_cols + c);
            ASSERT_EQ(writes[at], 1) << "row " << r << " col " << c;
            EXPECT_NEAR(y[at], want, 1e-4 * (1.0 + std::fabs(want))) << "row " << r << " col " << c;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace servetune::gpu
