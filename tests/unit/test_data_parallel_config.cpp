// Data-parallel settings: the replica router's choices (round_robin, shortest_queue) and EngineConfig's validity
// rules for dp_size / tp_size / ep_size / load_balance_method and for placing tensor-parallel ranks in processes (comm_backend,
// nnodes, node_rank, dist_init_addr, dist_timeout), with the messages a user sees.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "runtime/replica_router.h"
#include "servetune/engine_config.h"

namespace servetune {
namespace {

TEST(ReplicaRouter, RoundRobinCyclesWhateverTheLoad) {
  ReplicaRouter router(LoadBalanceMethod::kRoundRobin);
  const std::vector<ReplicaLoad> loads = {{5, 0}, {0, 100}, {1, 1}};
  std::vector<size_t> picks;
  for (int i = 0; i < 6; ++i) picks.push_back(router.choose(loads));
  EXPECT_EQ(picks, (std::vector<size_t>{0, 1, 2, 0, 1, 2}));
}

TEST(ReplicaRouter, ShortestQueueTakesFewestRequestsThenMostFreeKv) {
  ReplicaRouter router(LoadBalanceMethod::kShortestQueue);
  EXPECT_EQ(router.choose({{3, 10}, {1, 5}, {2, 50}}), 1u);   // fewest live requests
  EXPECT_EQ(router.choose({{2, 10}, {2, 40}, {2, 20}}), 1u);  // tie: most free KV blocks
  EXPECT_EQ(router.choose({{0, 8}, {0, 8}}), 0u);             // full tie: lowest index
}

TEST(ReplicaRouter, MethodNamesAreSglangs) {
  EXPECT_EQ(parse_load_balance_method("round_robin"), LoadBalanceMethod::kRoundRobin);
  EXPECT_EQ(parse_load_balance_method("shortest_queue"), LoadBalanceMethod::kShortestQueue);
  EXPECT_THROW(parse_load_balance_method("least_loaded"), Error);
}

EngineConfig with_model() {
  EngineConfig c;
  c.model = "m.gguf";
  return c;
}

std::string usage_message(const EngineConfig& c) {
  try {
    c.validate();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "validate() accepted the config";
  return "";
}

TEST(DataParallelConfig, ValidSettingsPass) {
  EngineConfig c = with_model();
  c.dp_size = 2;
  c.threads = 2;
  c.load_balance_method = LoadBalanceMethod::kShortestQueue;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.combination_problem(), "");
}

TEST(ExpertParallelConfig, EpMustDivideTpAsACombinationTheTunerSkips) {
  EngineConfig c = with_model();
  c.threads = 4;
  c.tp_size = 4;
  c.ep_size = 2;
  EXPECT_NO_THROW(c.validate());
  c.ep_size = 3;
  const std::string problem = "ep_size = 3 does not divide tp_size = 4";
  EXPECT_NE(usage_message(c).find(problem), std::string::npos);
  EXPECT_EQ(c.combination_problem(), usage_message(c));  // what the tuner's space turns into a skip
  c.tp_size = 1;
  c.ep_size = 2;  // ep without tensor-parallel ranks to split
  EXPECT_NE(usage_message(c).find("ep_size = 2 does not divide tp_size = 1"), std::string::npos);
  c.ep_size = 2048;
  EXPECT_NE(usage_message(c).find("tp_size, dp_size and ep_size must be at most 1024"), std::string::npos);
}

TEST(DataParallelConfig, BadSettingsGiveClearErrors) {
  EngineConfig c = with_model();
  c.dp_size = 0;
  EXPECT_NE(usage_message(c).find("dp_size and ep_size must be at least 1"), std::string::npos);
  c = with_model();
  c.dp_size = 3;
  c.threads = 2;
  EXPECT_NE(usage_message(c).find("tp_size x dp_size = 3 ranks need at least one thread each, but threads = 2"), std::string::npos);
  EXPECT_EQ(c.combination_problem(), usage_message(c));
  c = with_model();
  c.dp_size = static_cast<int>(std::thread::hardware_concurrency()) + 1;
  EXPECT_NE(usage_message(c).find("threads = 0 means all of them"), std::string::npos);
  try {
    from_json(nlohmann::json{{"load_balance_method", "minimum_tokens"}}, c);
    ADD_FAILURE() << "load_balance_method minimum_tokens was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("load_balance_method must be round_robin or shortest_queue, got 'minimum_tokens'"),
              std::string::npos);
  }
  c = with_model();
  c.dp_size = 2;
  c.threads = 2;
  c.max_total_tokens = 24;
  EXPECT_NE(usage_message(c).find("leaves less than one page (16 tokens) each"), std::string::npos);
  c = with_model();
  c.dp_size = 2;
  c.threads = 2;
  c.max_running_requests = 1;
  EXPECT_NE(usage_message(c).find("max_running_requests = 1 is less than dp_size = 2"), std::string::npos);
}

TEST(DataParallelConfig, TensorParallelismCombinesWithDataParallelWithinTheThreads) {
  EngineConfig c = with_model();
  c.tp_size = 2;
  c.threads = 2;
  EXPECT_NO_THROW(c.validate());
  c.dp_size = 2;
  EXPECT_NE(usage_message(c).find("tp_size x dp_size = 4 ranks need at least one thread each, but threads = 2"), std::string::npos);
  c.threads = 4;
  EXPECT_NO_THROW(c.validate());
}

TEST(DataParallelConfig, LoadBalanceMethodRoundTripsThroughJson) {
  EngineConfig c = with_model();
  c.load_balance_method = LoadBalanceMethod::kShortestQueue;
  nlohmann::json j;
  to_json(j, c);
  EXPECT_EQ(j["load_balance_method"], "shortest_queue");
  EngineConfig back;
  from_json(j, back);
  EXPECT_EQ(back.load_balance_method, LoadBalanceMethod::kShortestQueue);
}

// tp 2 over gloo, this process being `node_rank`.
EngineConfig gloo_node(int node_rank) {
  EngineConfig c = with_model();
  c.tp_size = 2;
  c.threads = 1;  // one rank in this process
  c.comm_backend = CommBackend::kGloo;
  c.nnodes = 2;
  c.node_rank = node_rank;
  c.dist_init_addr = "127.0.0.1:29500";
  return c;
}

TEST(PlacementConfig, GlooRanksInProcessesFollowSglangsNodeFlags) {
  EXPECT_NO_THROW(gloo_node(0).validate());
  EXPECT_NO_THROW(gloo_node(1).validate());
  EngineConfig c = gloo_node(0);
  c.tp_size = 1;
  c.nnodes = 1;
  EXPECT_NE(usage_message(c).find("comm_backend gloo connects the tensor-parallel ranks of several processes; it needs tp_size > 1"),
            std::string::npos);
  c = gloo_node(0);
  c.nnodes = 1;  // both ranks on this node: its process starts the other one, and needs a thread for each
  EXPECT_NE(usage_message(c).find("tp_size x dp_size = 2 ranks need at least one thread each, but threads = 1"), std::string::npos);
  c.threads = 2;
  EXPECT_NO_THROW(c.validate());
  c.tp_size = 4;
  c.nnodes = 3;
  c.threads = 4;
  EXPECT_NE(usage_message(c).find("spreads tp_size = 4 ranks evenly over nnodes = 3 nodes, which does not divide it"), std::string::npos);
  EXPECT_EQ(c.combination_problem(), usage_message(c));
  c = gloo_node(0);
  c.dist_init_addr.clear();
  EXPECT_NE(usage_message(c).find("comm_backend gloo needs dist_init_addr"), std::string::npos);
  c = gloo_node(0);
  c.dp_size = 2;
  c.threads = 2;
  EXPECT_NE(usage_message(c).find("comm_backend gloo with dp_size > 1 is not implemented yet"), std::string::npos);
  c.enable_dp_attention = true;  // DP attention: the processes are the dp_size = tp_size replicas, one per node here
  c.threads = 1;
  EXPECT_NO_THROW(c.validate());
  c.nnodes = 1;  // both replicas' ranks on this node: a thread each
  EXPECT_NE(usage_message(c).find("2 ranks need at least one thread each, but threads = 1"), std::string::npos);
  c = gloo_node(2);
  EXPECT_NE(usage_message(c).find("node_rank must be in [0, nnodes), got 2 with nnodes = 2"), std::string::npos);
  c = gloo_node(0);
  c.dist_init_addr = "localhost";
  EXPECT_NE(usage_message(c).find("dist_init_addr"), std::string::npos);
  c = gloo_node(0);
  c.dist_timeout = 0;
  EXPECT_NE(usage_message(c).find("dist_timeout must be at least 1 second"), std::string::npos);
}

TEST(PlacementConfig, NodeFlagsWithoutGlooAreErrorsNotIgnored) {
  EngineConfig c = gloo_node(0);
  c.comm_backend = CommBackend::kLocal;
  EXPECT_NE(usage_message(c).find("nnodes and node_rank place tensor-parallel ranks in several processes, which needs comm_backend gloo"),
            std::string::npos);
  c.nnodes = 1;
  EXPECT_NE(usage_message(c).find("dist_init_addr is the rendezvous of comm_backend gloo"), std::string::npos);
  try {
    parse_comm_backend("mpi");
    ADD_FAILURE() << "comm_backend mpi was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("comm_backend must be local, gloo or nccl, got 'mpi'"), std::string::npos);
  }
  c = with_model();
  c.comm_backend = CommBackend::kNccl;
  try {
    c.validate();
    ADD_FAILURE() << "nccl on the CPU device was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
  }
}

TEST(PlacementConfig, RoundTripsThroughJson) {
  EngineConfig c = gloo_node(1);
  c.dist_timeout = 7;
  nlohmann::json j;
  to_json(j, c);
  EngineConfig back;
  from_json(j, back);
  EXPECT_EQ(back.comm_backend, CommBackend::kGloo);
  EXPECT_EQ(back.nnodes, 2);
  EXPECT_EQ(back.node_rank, 1);
  EXPECT_EQ(back.dist_init_addr, "127.0.0.1:29500");
  EXPECT_EQ(back.dist_timeout, 7);
}

}  // namespace
}  // namespace servetune
