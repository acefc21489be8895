// Communicator failure handling and plumbing: a rank that never joins, throws or aborts makes the others throw
// Error within the timeout (no hang); mismatched calls; the backend factory's errors; the TCP rendezvous store;
// gloo over the TCP store; and a real two-process gloo group (this test binary re-run as rank 1).
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>

#include "child_process.h"
#include "comm/tcp_store.h"
#include "comm_test_util.h"
#include "core/error.h"

namespace servetune {
namespace {

using test::run_ranks;

class CommFailureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CommFailureTest, RankThatNeverJoinsGivesErrorNotHang) {
  const auto outcomes = run_ranks(
      GetParam(), 3, std::chrono::milliseconds(1500),
      [](Communicator& c) {
        float v = 1;
        c.all_reduce(&v, 1, ReduceOp::kSum);
      },
      [](int r) { return r == 2; });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(outcomes[static_cast<size_t>(r)].error) << "rank " << r << " should have failed";
    EXPECT_NE(outcomes[static_cast<size_t>(r)].message.find("communicator " + GetParam()), std::string::npos)
        << outcomes[static_cast<size_t>(r)].message;
  }
  if (GetParam() == "local") {
    EXPECT_NE(outcomes[0].message.find("waiting for rank(s) 2"), std::string::npos) << outcomes[0].message;
  }
}

TEST_P(CommFailureTest, RankThatThrowsMakesPeersFailAndLaterCallsFailAtOnce) {
  const auto outcomes = run_ranks(GetParam(), 3, std::chrono::milliseconds(60000), [](Communicator& c) {
    c.barrier();
    if (c.rank() == 1) throw std::runtime_error("rank 1 crashed");
    std::vector<float> v(1000, 1.0f);
    try {
      c.all_reduce(v.data(), v.size(), ReduceOp::kSum);
    } catch (const Error&) {
      float w = 0;
      EXPECT_THROW(c.all_reduce(&w, 1, ReduceOp::kSum), Error);  // the group stays broken
      throw;
    }
  });
  EXPECT_EQ(outcomes[1].message, "rank 1 crashed");
  for (int r : {0, 2}) EXPECT_TRUE(outcomes[static_cast<size_t>(r)].error) << "rank " << r << " should have failed";
}

TEST_P(CommFailureTest, AbortedRankMakesPeersFail) {
  const auto outcomes = run_ranks(GetParam(), 2, std::chrono::milliseconds(60000), [](Communicator& c) {
    c.barrier();
    if (c.rank() == 0) {
      c.abort("out of memory");
      EXPECT_THROW(c.barrier(), Error);
      return;
    }
    int64_t v = 1;
    c.all_reduce(&v, 1, ReduceOp::kSum);
  });
  ASSERT_TRUE(outcomes[1].error);
  if (GetParam() == "local") {
    EXPECT_NE(outcomes[1].message.find("rank 0 aborted: out of memory"), std::string::npos) << outcomes[1].message;
  }
}

TEST_P(CommFailureTest, BadArgumentsAreUsageErrors) {
  const auto outcomes = run_ranks(GetParam(), 2, std::chrono::milliseconds(60000), [](Communicator& c) {
    float v = 0;
    EXPECT_THROW(c.all_gatherv(&v, &v, {1}), Error);
    EXPECT_THROW(c.broadcast(&v, 1, 2), Error);
    c.barrier();
  });
  for (const auto& o : outcomes) EXPECT_FALSE(o.error) << o.message;
}

INSTANTIATE_TEST_SUITE_P(Backends, CommFailureTest, ::testing::Values("local", "gloo"));

TEST(LocalComm, MismatchedCollectivesAreAnErrorOnEveryRank) {
  const auto outcomes = run_ranks("local", 2, std::chrono::milliseconds(60000), [](Communicator& c) {
    std::vector<float> v(static_cast<size_t>(c.rank() + 1));
    c.all_reduce(v.data(), v.size(), ReduceOp::kSum);
  });
  for (const auto& o : outcomes) {
    ASSERT_TRUE(o.error);
    EXPECT_NE(o.message.find("ranks disagree"), std::string::npos) << o.message;
  }
}

TEST(LocalComm, AllToAllvCountsThatDoNotPairUpAreAnError) {
  const auto outcomes = run_ranks("local", 2, std::chrono::milliseconds(60000), [](Communicator& c) {
    std::vector<float> in(2), out(4);
    c.all_to_allv(in.data(), {1, 1}, out.data(), {1, c.rank() == 0 ? size_t{3} : size_t{1}});
  });
  EXPECT_TRUE(outcomes[0].error);
  EXPECT_TRUE(outcomes[1].error);
  EXPECT_NE(outcomes[0].message.find("rank 1 sends 1 elements to rank 0, which expects 3"), std::string::npos) << outcomes[0].message;
}

TEST(CommFactory, UnknownBackendAndMissingPiecesAreClearErrors) {
  CommSpec spec;
  try {
    make_communicator("mpi", spec);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("unknown communicator backend 'mpi' (available: local, gloo"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_communicator("local", spec), Error);  // no group
  EXPECT_THROW(make_communicator("gloo", spec), Error);   // no rendezvous
  spec.rank = 2;
  EXPECT_THROW(make_communicator("local", spec), Error);
#ifndef SERVETUNE_WITH_NCCL
  try {
    make_communicator("nccl", CommSpec{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
#endif
  auto group = LocalGroup::create(2);
  CommSpec ok;
  ok.size = 2;
  ok.local_group = group;
  auto first = make_communicator("local", ok);
  EXPECT_THROW(make_communicator("local", ok), Error);  // rank 0 taken twice
}

TEST(CommFactory, NodeRankSpecFollowsSglangLayout) {
  const CommSpec spec = node_rank_spec(8, 2, 1, 3, "10.0.0.1:5000");
  EXPECT_EQ(spec.rank, 7);
  EXPECT_EQ(spec.device, 3);
  EXPECT_EQ(spec.size, 8);
  EXPECT_THROW(node_rank_spec(6, 4, 0, 0, "h:1"), Error);  // 6 ranks do not split over 4 nodes
  EXPECT_THROW(node_rank_spec(8, 2, 2, 0, "h:1"), Error);  // node_rank out of range
  EXPECT_THROW(node_rank_spec(8, 2, 0, 4, "h:1"), Error);  // local rank out of range
  EXPECT_THROW(node_rank_spec(8, 2, 0, 0, ""), Error);     // no address for several nodes
}

TEST(TcpStore, ServerAndClientsShareKeysAndMissingKeysTimeOut) {
  EXPECT_THROW(parse_host_port("localhost", "dist_init_addr"), Error);
  EXPECT_THROW(parse_host_port("h:70000", "dist_init_addr"), Error);
  EXPECT_EQ(parse_host_port("10.0.0.1:5000", "x"), (std::pair<std::string, int>{"10.0.0.1", 5000}));
  TcpStore server("127.0.0.1", 0, true, std::chrono::milliseconds(300));
  ASSERT_GT(server.port(), 0);
  TcpStore client("127.0.0.1", server.port(), false, std::chrono::milliseconds(300));
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server.set("id", {'a', 'b'});
  });
  TcpStore waiting("127.0.0.1", server.port(), false, std::chrono::milliseconds(30000));
  EXPECT_EQ(waiting.get("id"), (std::vector<char>{'a', 'b'}));
  late.join();
  client.set("x", {'1'});
  EXPECT_EQ(server.get("x"), std::vector<char>{'1'});
  EXPECT_THROW(client.get("missing"), Error);
  EXPECT_THROW(server.get("missing"), Error);
}

TEST(TcpStore, ClientWithoutServerFailsWithinTimeout) {
  EXPECT_THROW(TcpStore("127.0.0.1", 1, false, std::chrono::milliseconds(200)), Error);
}

void gloo_rank_body(Communicator& c) {
  std::vector<float> v = {static_cast<float>(c.rank() + 1), 2.0f};
  c.all_reduce(v.data(), v.size(), ReduceOp::kSum);
  if (v != std::vector<float>{3.0f, 4.0f}) throw std::runtime_error("all_reduce gave a wrong result");
  std::vector<int32_t> g(2);
  const int32_t mine = 7 * c.rank();
  c.all_gather(&mine, g.data(), 1);
  if (g != std::vector<int32_t>{0, 7}) throw std::runtime_error("all_gather gave a wrong result");
  c.barrier();
}

TEST(GlooComm, RendezvousOverTheTcpStore) {
  const std::string addr = "127.0.0.1:" + std::to_string(testing::free_port());
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommSpec spec;
        spec.rank = r;
        spec.size = 2;
        spec.timeout = std::chrono::milliseconds(60000);
        spec.dist_init_addr = addr;
        auto comm = make_communicator("gloo", spec);
        gloo_rank_body(*comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
}

// Rank 1 of TwoProcesses: runs only when the parent test starts this binary with SERVETUNE_COMM_CHILD_ADDR.
TEST(GlooComm, TwoProcessesChildRank) {
  const char* addr = std::getenv("SERVETUNE_COMM_CHILD_ADDR");
  if (addr == nullptr) GTEST_SKIP() << "runs as the child of GlooComm.TwoProcesses";
  CommSpec spec;
  spec.rank = 1;
  spec.size = 2;
  spec.timeout = std::chrono::milliseconds(60000);
  spec.dist_init_addr = addr;
  auto comm = make_communicator("gloo", spec);
  gloo_rank_body(*comm);
}

TEST(GlooComm, TwoProcesses) {
  const std::string addr = "127.0.0.1:" + std::to_string(testing::free_port());
  testing::ChildProcess child("GlooComm.TwoProcessesChildRank", "SERVETUNE_COMM_CHILD_ADDR=" + addr);
  ASSERT_TRUE(child.started());
  std::string error;
  try {
    CommSpec spec;
    spec.rank = 0;
    spec.size = 2;
    spec.timeout = std::chrono::milliseconds(60000);
    spec.dist_init_addr = addr;
    auto comm = make_communicator("gloo", spec);
    gloo_rank_body(*comm);
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_EQ(error, "");
  EXPECT_TRUE(child.succeeded()) << "child rank failed, status " << child.wait();
}

}  // namespace
}  // namespace servetune
