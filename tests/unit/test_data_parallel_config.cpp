// Data-parallel settings: the replica router's choices (round_robin, shortest_queue) and EngineConfig's validity
// rules for dp_size / tp_size / load_balance_method, with the messages a user sees.
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
  c.load_balance_method = "shortest_queue";
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.combination_problem(), "");
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
  c = with_model();
  c.load_balance_method = "minimum_tokens";
  EXPECT_NE(usage_message(c).find("load_balance_method must be round_robin or shortest_queue, got 'minimum_tokens'"), std::string::npos);
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
  c.load_balance_method = "shortest_queue";
  nlohmann::json j;
  to_json(j, c);
  EngineConfig back;
  from_json(j, back);
  EXPECT_EQ(back.load_balance_method, "shortest_queue");
}

}  // namespace
}  // namespace servetune
