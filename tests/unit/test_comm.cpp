// Every collective of the local and gloo communicators, with ranks as threads: sum/max reductions on float and
// integer buffers, equal and uneven (including empty) all_gatherv / reduce_scatter / all_to_allv blocks,
// broadcast from a non-zero root, and a long mixed sequence.
#include <gtest/gtest.h>

#include <numeric>

#include "comm_test_util.h"

namespace servetune {
namespace {

using test::run_ranks;
constexpr std::chrono::milliseconds kTimeout{60000};

class CommTest : public ::testing::TestWithParam<std::string> {
 protected:
  void run(int size, const std::function<void(Communicator&)>& body) {
    const auto outcomes = run_ranks(GetParam(), size, kTimeout, body);
    for (size_t r = 0; r < outcomes.size(); ++r) EXPECT_FALSE(outcomes[r].error) << "rank " << r << ": " << outcomes[r].message;
  }
};

TEST_P(CommTest, AllReduceSumAndMaxOnFloatAndIntegers) {
  run(3, [](Communicator& c) {
    const int r = c.rank();
    std::vector<float> f = {1.5f * static_cast<float>(r), -1.0f, static_cast<float>(r * r)};
    c.all_reduce(f.data(), f.size(), ReduceOp::kSum);
    EXPECT_EQ(f, (std::vector<float>{4.5f, -3.0f, 5.0f}));
    std::vector<int32_t> i32 = {r, 10 - r};
    c.all_reduce(i32.data(), i32.size(), ReduceOp::kMax);
    EXPECT_EQ(i32, (std::vector<int32_t>{2, 10}));
    std::vector<int64_t> i64 = {int64_t{1} << (40 + r)};
    c.all_reduce(i64.data(), i64.size(), ReduceOp::kSum);
    EXPECT_EQ(i64[0], (int64_t{1} << 40) + (int64_t{1} << 41) + (int64_t{1} << 42));
    std::vector<float> big(5000);
    for (size_t k = 0; k < big.size(); ++k) big[k] = static_cast<float>(k % 7) + static_cast<float>(r);
    c.all_reduce(big.data(), big.size(), ReduceOp::kMax);
    for (size_t k = 0; k < big.size(); ++k) ASSERT_EQ(big[k], static_cast<float>(k % 7) + 2.0f);
  });
}

TEST_P(CommTest, AllGatherEqualSizes) {
  run(4, [](Communicator& c) {
    const std::vector<int32_t> mine = {c.rank() * 10, c.rank() * 10 + 1};
    std::vector<int32_t> all(8, -1);
    c.all_gather(mine.data(), all.data(), 2);
    EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 10, 11, 20, 21, 30, 31}));
  });
}

TEST_P(CommTest, AllGathervUnevenSizesIncludingEmpty) {
  run(3, [](Communicator& c) {
    const std::vector<size_t> counts = {3, 0, 5};
    std::vector<float> mine(counts[static_cast<size_t>(c.rank())]);
    for (size_t k = 0; k < mine.size(); ++k) mine[k] = static_cast<float>(c.rank() * 100 + static_cast<int>(k));
    std::vector<float> all(8, -1.0f);
    c.all_gatherv(mine.data(), all.data(), counts);
    EXPECT_EQ(all, (std::vector<float>{0, 1, 2, 200, 201, 202, 203, 204}));
  });
}

TEST_P(CommTest, ReduceScatterUnevenSizes) {
  run(3, [](Communicator& c) {
    const std::vector<size_t> counts = {1, 3, 2};
    std::vector<int64_t> in(6);
    std::iota(in.begin(), in.end(), int64_t{c.rank()});  // rank r: r, r+1, ..., r+5
    std::vector<int64_t> out(counts[static_cast<size_t>(c.rank())], -1);
    c.reduce_scatter(in.data(), out.data(), counts, ReduceOp::kSum);
    const std::vector<std::vector<int64_t>> expected = {{3}, {6, 9, 12}, {15, 18}};  // sum over r of (k + r) = 3k + 3
    EXPECT_EQ(out, expected[static_cast<size_t>(c.rank())]);
  });
}

TEST_P(CommTest, AllToAllEqualSizes) {
  run(3, [](Communicator& c) {
    std::vector<int32_t> in(6), out(6, -1);
    for (int p = 0; p < 3; ++p) {
      in[static_cast<size_t>(2 * p)] = c.rank() * 10 + p;
      in[static_cast<size_t>(2 * p + 1)] = -(c.rank() * 10 + p);
    }
    c.all_to_all(in.data(), out.data(), 2);
    for (int p = 0; p < 3; ++p) {
      EXPECT_EQ(out[static_cast<size_t>(2 * p)], p * 10 + c.rank());
      EXPECT_EQ(out[static_cast<size_t>(2 * p + 1)], -(p * 10 + c.rank()));
    }
  });
}

TEST_P(CommTest, AllToAllvUnevenSizesIncludingEmpty) {
  // Rank r sends (r + p) % 3 elements to rank p, each valued 100 r + p.
  run(3, [](Communicator& c) {
    const int r = c.rank();
    std::vector<size_t> send(3), recv(3);
    std::vector<float> in;
    for (int p = 0; p < 3; ++p) {
      send[static_cast<size_t>(p)] = static_cast<size_t>((r + p) % 3);
      recv[static_cast<size_t>(p)] = static_cast<size_t>((p + r) % 3);
      for (size_t k = 0; k < send[static_cast<size_t>(p)]; ++k) in.push_back(static_cast<float>(100 * r + p));
    }
    std::vector<float> out(std::accumulate(recv.begin(), recv.end(), size_t{0}), -1.0f);
    c.all_to_allv(in.data(), send, out.data(), recv);
    std::vector<float> expected;
    for (int p = 0; p < 3; ++p) {
      for (size_t k = 0; k < recv[static_cast<size_t>(p)]; ++k) expected.push_back(static_cast<float>(100 * p + r));
    }
    EXPECT_EQ(out, expected);
  });
}

TEST_P(CommTest, BroadcastFromNonZeroRoot) {
  run(3, [](Communicator& c) {
    std::vector<float> data(4, static_cast<float>(c.rank()));
    if (c.rank() == 1) data = {7, 8, 9, 10};
    c.broadcast(data.data(), data.size(), 1);
    EXPECT_EQ(data, (std::vector<float>{7, 8, 9, 10}));
    std::vector<int64_t> ids = {c.rank() == 2 ? int64_t{42} : int64_t{0}};
    c.broadcast(ids.data(), 1, 2);
    EXPECT_EQ(ids[0], 42);
  });
}

TEST_P(CommTest, ManyCollectivesInARowAndSingleRankGroups) {
  run(2, [](Communicator& c) {
    for (int i = 0; i < 50; ++i) {
      int32_t v = c.rank() + i;
      c.all_reduce(&v, 1, ReduceOp::kSum);
      ASSERT_EQ(v, 2 * i + 1);
      c.barrier();
      std::vector<int32_t> g(2);
      c.all_gather(&i, g.data(), 1);
      ASSERT_EQ(g, (std::vector<int32_t>{i, i}));
    }
  });
  run(1, [](Communicator& c) {
    float v = 3;
    c.all_reduce(&v, 1, ReduceOp::kSum);
    EXPECT_EQ(v, 3);
    c.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, CommTest, ::testing::Values("local", "gloo"));

}  // namespace
}  // namespace servetune
