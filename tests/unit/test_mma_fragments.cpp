// The tensor-core kernels' index math (backend/cuda/mma_fragments.h) on the CPU: each m16n8k16 fragment layout covers
// its matrix once, matches the PTX ISA's formulas at sample lanes, and one warp's S = Q K^T and O = P V, computed the
// way prefill_attention_mma.cu addresses its fragments (K and V as [key][dim] rows, P reusing the score C fragments as
// A) through a simulated mma, equal plain matrix products; the kernels' ldmatrix row addresses load those same B
// fragments, and A fragments from row-major tiles; and the attention plan's tiles cut a mixed batch into runs of one
// sequence of at most 64 / group tokens.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "backend/cuda/mma_fragments.h"
#include "mma_simulator.h"

namespace servetune::gpu::mma {
namespace {

using Fn = int (*)(int, int);

// Every (lane, element) pair maps into rows x cols, and every cell is held exactly once.
void expect_covers(Fn row, Fn col, int per_lane, int rows, int cols) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < per_lane; ++i) {
      const int r = row(lane, i), c = col(lane, i);
      ASSERT_GE(r, 0);
      ASSERT_LT(r, rows);
      ASSERT_GE(c, 0);
      ASSERT_LT(c, cols);
      EXPECT_TRUE(seen.insert({r, c}).second) << "lane " << lane << " element " << i << " repeats (" << r << ", " << c << ")";
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), rows * cols);
}

TEST(MmaFragments, EachLayoutCoversItsMatrixOnce) {
  expect_covers(a_row, a_col, 8, 16, 16);
  expect_covers(b_row, b_col, 4, 16, 8);
  expect_covers(c_row, c_col, 4, 16, 8);
}

// The ISA's formulas at lanes 0, 5 (groupID 1, threadID_in_group 1) and 31 (7, 3).
TEST(MmaFragments, MatchTheIsaFormulasAtSampleLanes) {
  EXPECT_EQ(std::make_pair(a_row(0, 0), a_col(0, 0)), std::make_pair(0, 0));
  EXPECT_EQ(std::make_pair(a_row(0, 7), a_col(0, 7)), std::make_pair(8, 9));
  EXPECT_EQ(std::make_pair(a_row(5, 1), a_col(5, 1)), std::make_pair(1, 3));
  EXPECT_EQ(std::make_pair(a_row(5, 3), a_col(5, 3)), std::make_pair(9, 3));
  EXPECT_EQ(std::make_pair(a_row(5, 4), a_col(5, 4)), std::make_pair(1, 10));
  EXPECT_EQ(std::make_pair(a_row(31, 6), a_col(31, 6)), std::make_pair(15, 14));
  EXPECT_EQ(std::make_pair(b_row(5, 0), b_col(5, 0)), std::make_pair(2, 1));
  EXPECT_EQ(std::make_pair(b_row(5, 3), b_col(5, 3)), std::make_pair(11, 1));
  EXPECT_EQ(std::make_pair(b_row(31, 1), b_col(31, 1)), std::make_pair(7, 7));
  EXPECT_EQ(std::make_pair(c_row(5, 1), c_col(5, 1)), std::make_pair(1, 3));
  EXPECT_EQ(std::make_pair(c_row(31, 2), c_col(31, 2)), std::make_pair(15, 6));
}

// A element i of the 16-column slice kk is C element a_from_c(i) of score tile 2 kk + tile, same lane, same cell.
TEST(MmaFragments, ScoreAccumulatorsReuseAsTheNextAFragment) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) {
      int tile = -1;
      const int e = a_from_c(i, tile);
      EXPECT_EQ(a_row(lane, i), c_row(lane, e)) << lane << " " << i;
      EXPECT_EQ(a_col(lane, i), 8 * tile + c_col(lane, e)) << lane << " " << i;
    }
  }
}

// One warp's 16 query rows against 64 keys, addressed as the kernel does, against plain products.
TEST(MmaFragments, WarpScoresAndWeightedValuesMatchPlainProducts) {
  constexpr int kDim = 32, kKeys = 64;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(16 * kDim), k(kKeys * kDim), v(kKeys * kDim);  // row-major [row][dim], [key][dim]
  for (auto* m : {&q, &k, &v}) {
    for (float& x : *m) x = dist(rng);
  }
  // S = Q K^T: A from Q rows, B element (k, n) = K[8 nt + n][16 s + k].
  std::vector<CFrag> s(kKeys / 8);
  for (int nt = 0; nt < kKeys / 8; ++nt) {
    s[nt] = {};
    for (int st = 0; st < kDim / 16; ++st) {
      AFrag a{};
      BFrag b{};
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 8; ++i) a[lane][i] = q[a_row(lane, i) * kDim + 16 * st + a_col(lane, i)];
        for (int i = 0; i < 4; ++i) b[lane][i] = k[(8 * nt + b_col(lane, i)) * kDim + 16 * st + b_row(lane, i)];
      }
      simulated_mma(a, b, s[nt]);
    }
  }
  std::vector<float> p(16 * kKeys);  // the plain scores, used as P below
  for (int r = 0; r < 16; ++r) {
    for (int j = 0; j < kKeys; ++j) {
      float sum = 0.0f;
      for (int d = 0; d < kDim; ++d) sum += q[r * kDim + d] * k[j * kDim + d];
      p[r * kKeys + j] = sum;
    }
  }
  for (int nt = 0; nt < kKeys / 8; ++nt) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 4; ++i) {
        EXPECT_NEAR(s[nt][lane][i], p[c_row(lane, i) * kKeys + 8 * nt + c_col(lane, i)], 1e-4) << nt << " " << lane << " " << i;
      }
    }
  }
  // O = P V: A from the score fragments (a_from_c), B element (k, n) = V[16 kk + k][8 dt + n].
  for (int dt = 0; dt < kDim / 8; ++dt) {
    CFrag o{};
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      AFrag a{};
      BFrag b{};
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 8; ++i) {
          int tile = 0;
          const int e = a_from_c(i, tile);
          a[lane][i] = s[2 * kk + tile][lane][e];
        }
        for (int i = 0; i < 4; ++i) b[lane][i] = v[(16 * kk + b_row(lane, i)) * kDim + 8 * dt + b_col(lane, i)];
      }
      simulated_mma(a, b, o);
    }
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 4; ++i) {
        float sum = 0.0f;
        for (int j = 0; j < kKeys; ++j) sum += p[c_row(lane, i) * kKeys + j] * v[j * kDim + 8 * dt + c_col(lane, i)];
        EXPECT_NEAR(o[lane][i], sum, 1e-3) << dt << " " << lane << " " << i;
      }
    }
  }
}

// The ldmatrix row addresses the kernel gives (ldsm_k_*, ldsm_v_*) load exactly the B fragments the direct mapping
// names: K for key tile nt and k-steps s, s + 1; V (transposed) for keys 16 kk.. and dim tiles dt, dt + 1.
TEST(MmaFragments, LdmatrixRowAddressesGiveTheBFragments) {
  constexpr int kDim = 64, kKeys = 64;
  std::vector<float> kv(kKeys * kDim);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i);
  for (int nt = 0; nt < kKeys / 8; ++nt) {
    for (int s = 0; s < kDim / 16; s += 2) {
      std::array<std::pair<int, int>, 32> starts;
      for (int lane = 0; lane < 32; ++lane) starts[lane] = {8 * nt + ldsm_k_key(lane), 16 * s + ldsm_k_dim(lane)};
      const auto regs = simulated_ldmatrix(kv, kDim, false, starts);
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i) {  // registers 0, 1: b0..b3 of step s; 2, 3: of step s + 1
          for (int half = 0; half < 2; ++half) {
            const int step = s + half;
            const float want = kv[(8 * nt + b_col(lane, i)) * kDim + 16 * step + b_row(lane, i)];
            EXPECT_EQ(regs[lane][2 * half + i / 2][i % 2], want) << "K nt " << nt << " s " << step << " lane " << lane;
          }
        }
      }
    }
  }
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    for (int dt = 0; dt < kDim / 8; dt += 2) {
      std::array<std::pair<int, int>, 32> starts;
      for (int lane = 0; lane < 32; ++lane) starts[lane] = {16 * kk + ldsm_v_key(lane), 8 * dt + ldsm_v_dim(lane)};
      const auto regs = simulated_ldmatrix(kv, kDim, true, starts);
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i) {
          for (int half = 0; half < 2; ++half) {
            const int tile = dt + half;
            const float want = kv[(16 * kk + b_row(lane, i)) * kDim + 8 * tile + b_col(lane, i)];
            EXPECT_EQ(regs[lane][2 * half + i / 2][i % 2], want) << "V kk " << kk << " dt " << tile << " lane " << lane;
          }
        }
      }
    }
  }
}

// ldsm_a_* row addresses over a row-major [row][k] array load the A fragment of k-step s (registers 0..3 holding
// a0 a1, a2 a3, a4 a5, a6 a7).
TEST(MmaFragments, LdmatrixRowAddressesGiveTheAFragment) {
  constexpr int kRows = 16, kCols = 64;
  std::vector<float> a(kRows * kCols);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (int s = 0; s < kCols / 16; ++s) {
    std::array<std::pair<int, int>, 32> starts;
    for (int lane = 0; lane < 32; ++lane) starts[lane] = {ldsm_a_row(lane), 16 * s + ldsm_a_col(lane)};
    const auto regs = simulated_ldmatrix(a, kCols, false, starts);
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 8; ++i) {
        EXPECT_EQ(regs[lane][i / 2][i % 2], a[a_row(lane, i) * kCols + 16 * s + a_col(lane, i)]) << s << " " << lane << " " << i;
      }
    }
  }
}

// A batch of a decode token, a chunk continuing 500 cached positions, two fresh prompts and another decode token:
// the tiles tile_starts cuts are runs of one sequence, at most tile_tokens(group) long, positions in one window.
TEST(MmaFragments, PlanTilesAreRunsOfOneSequenceWithinAWindow) {
  std::vector<int32_t> seq, pos;
  const auto add = [&](int32_t s, int32_t first, int32_t count) {
    for (int32_t i = 0; i < count; ++i) {
      seq.push_back(s);
      pos.push_back(first + i);
    }
  };
  add(0, 99, 1);
  add(1, 500, 300);
  add(2, 0, 70);
  add(3, 0, 5);
  add(4, 1000, 1);
  for (int group : {1, 3, 4, 8, 64}) {
    const int tokens = tile_tokens(group);
    ASSERT_GE(tokens, 1);
    std::vector<size_t> starts;
    for (size_t t = 0; t < seq.size(); ++t) {
      if (t == 0 || tile_starts(static_cast<int64_t>(t), seq[t], seq[t - 1], pos[t], pos[t - 1], tokens)) starts.push_back(t);
    }
    starts.push_back(seq.size());
    for (size_t k = 0; k + 1 < starts.size(); ++k) {
      const size_t b = starts[k], e = starts[k + 1];
      ASSERT_LT(b, e);
      EXPECT_LE(e - b, static_cast<size_t>(tokens)) << "group " << group;
      for (size_t t = b; t < e; ++t) {
        EXPECT_EQ(seq[t], seq[b]);
        EXPECT_EQ(pos[t] / tokens, pos[b] / tokens);
      }
    }
    // Fewest tiles with these rules: about n / tokens plus one partial tile per sequence boundary.
    EXPECT_LE(starts.size() - 1, seq.size() / tokens + 2 * 5 + 2) << "group " << group;
  }
  EXPECT_EQ(tile_tokens(0), 0);
  EXPECT_EQ(tile_tokens(65), 0);  // more than 64 query heads per KV head: the kernel does not apply
  EXPECT_EQ(tile_tokens(3), 21);  // SmolLM2's 9 / 3 heads: 63 of 64 rows used
}

}  // namespace
}  // namespace servetune::gpu::mma
