// Tensor parallelism across two processes over gloo: this test binary is rank 0 (the engine) and re-runs itself as
// the worker (node_rank 1, run_tensor_parallel_worker) on a free localhost port. Logits within 1e-5 relative and
// greedy outputs of the mixed batch identical to tp 1 on stories260K and make-model's tiny-gqa (12 heads over 3 KV
// heads, split 2 + 1 groups); an idle engine keeps its worker; a worker that never starts, dies mid-run or loads
// another model is a clear error. The mixture-of-experts family (deepseek-v3-tiny, qwen3-moe-tiny) over 2 and 4
// processes: tp 2, ep 2, tp 4 x ep 2 and ep 4 logits within 1e-5 relative of tp 1, greedy outputs of ep 2 identical.
// DP attention over processes (one replica per process, the schedulers in the engine's): greedy outputs of
// deepseek-v3-tiny and qwen3-moe-tiny identical to one rank with gathered and all-to-all MoE layers, at 2 and 4
// replicas, the expert counters counted once; a replica's worker that never starts, dies mid-run or loads another
// model is a clear error, and an idle engine keeps its workers.
// Through the servetune binary: with both ranks on one node (nnodes 1) the node's process starts the other itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <nlohmann/json.hpp>

#include "child_process.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "integration/greedy_jobs.h"
#include "integration/moe_counters.h"
#include "integration/random_model.h"
#include "integration/tp_logits.h"
#ifdef SERVETUNE_BIN
#include "integration/tuner/tuner_cli.h"
#endif
#include "model/checkpoint.h"
#include "servetune/engine.h"
#include "servetune/tensor_parallel_worker.h"
#include "test_paths.h"

namespace servetune {
namespace {

using testing::Job;

constexpr const char* kWorkerEnv = "SERVETUNE_TP_WORKER_CONFIG";

// The worker process: runs only as the child the tests below start, with its EngineConfig as JSON in kWorkerEnv.
TEST(GlooWorker, ChildRank) {
  const char* json = std::getenv(kWorkerEnv);
  if (json == nullptr) GTEST_SKIP() << "runs as the worker process of the GlooTensorParallel tests";
  try {
    run_tensor_parallel_worker(nlohmann::json::parse(json).get<EngineConfig>());
  } catch (const std::exception& e) {  // some tests make the worker fail on purpose; the parent checks the status
    std::fprintf(stderr, "worker process: %s\n", e.what());
    std::_Exit(1);
  }
}

// The rendezvous address; DP attention also listens on its port + r for every replica r (up to dp 4 here).
std::string fresh_addr() { return "127.0.0.1:" + std::to_string(testing::free_port_run(8)); }

// tp 2 over gloo, one thread per process; node_rank 0 is the engine.
EngineConfig gloo_config(const std::string& model, int node_rank, const std::string& addr) {
  EngineConfig c = testing::chunked_config(model);
  c.threads = 1;
  c.tp_size = 2;
  c.comm_backend = CommBackend::kGloo;
  c.nnodes = 2;
  c.node_rank = node_rank;
  c.dist_init_addr = addr;
  c.dist_timeout = 60;
  return c;
}

// The node_rank `node` process of the group `config` describes.
std::unique_ptr<testing::ChildProcess> start_worker(EngineConfig config, int node = 1) {
  config.node_rank = node;
  const nlohmann::json json = config;
  auto child = std::make_unique<testing::ChildProcess>("GlooWorker.ChildRank", std::string(kWorkerEnv) + "=" + json.dump());
  EXPECT_TRUE(child->started());
  return child;
}

// Every node process but node 0's (the engine) of the group `config` describes.
std::vector<std::unique_ptr<testing::ChildProcess>> start_workers(const EngineConfig& config) {
  std::vector<std::unique_ptr<testing::ChildProcess>> workers;
  for (int node = 1; node < config.nnodes; ++node) workers.push_back(start_worker(config, node));
  return workers;
}

// The error a request's stream ends with; fails the test when it ends otherwise.
std::string final_error(const std::shared_ptr<RequestStream>& stream) {
  while (auto e = stream->next()) {
    if (e->finish == FinishReason::kNone) continue;
    EXPECT_EQ(e->finish, FinishReason::kError);
    return e->error;
  }
  ADD_FAILURE() << "the stream ended without a final event";
  return "";
}

// An engine idle for longer than its workers' 1 s timeout keeps them (keep-alives): the same outputs afterwards.
void expect_idle_keeps_workers(EngineConfig c) {
  c.dist_timeout = 1;
  auto workers = start_workers(c);
  {
    Engine engine(c);
    const auto jobs = testing::mixed_jobs(engine.tokenizer(), 3, 6);
    const auto first = testing::run_greedy(engine, jobs, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the workers wait for the next step meanwhile
    EXPECT_EQ(testing::run_greedy(engine, jobs, true), first);
  }
  for (auto& w : workers) EXPECT_TRUE(w->succeeded()) << "worker status " << w->wait();
}

void expect_gloo_logits_match(const std::string& model) {
  const std::string addr = fresh_addr();
  auto worker = start_worker(gloo_config(model, 1, addr));
  const Checkpoint ck(model, LoadFormat::kAuto);
  TensorParallelGroup one(ck, "cpu", 1, 1);
  one.create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
  {
    CommSpec spec = node_rank_spec(2, 2, 0, 0, addr);
    spec.timeout = std::chrono::seconds(60);
    TensorParallelGroup two(ck, "cpu", 1, make_communicator("gloo", spec), spec.timeout);
    two.create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
    testing::expect_groups_match(model, {&one, &two}, {"tp 1", "tp 2 over gloo"});
  }  // tells the worker to stop
  EXPECT_TRUE(worker->succeeded()) << "worker status " << worker->wait();
}

TEST(GlooTensorParallelLogits, StoriesMatchOneRank) { expect_gloo_logits_match(testing::stories_path()); }

TEST(GlooTensorParallelLogits, RandomLlamaWithUnevenKvGroupsMatchesOneRank) {
  const testing::RandomModel gqa("tiny-gqa");
  expect_gloo_logits_match(gqa.path());
}

// The mixture-of-experts family: each layout's tp_size ranks as processes (one per node, this one rank 0), logits
// against tp 1 as above.
void expect_gloo_moe_logits_match(const std::string& model) {
  const Checkpoint ck(model, LoadFormat::kAuto);
  TensorParallelGroup one(ck, "cpu", 1, 1);
  one.create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
  for (const auto& [tp, ep] : std::vector<std::pair<int, int>>{{2, 1}, {2, 2}, {4, 2}, {4, 4}}) {
    const std::string addr = fresh_addr();
    EngineConfig c = gloo_config(model, 0, addr);
    c.tp_size = tp;
    c.nnodes = tp;
    c.ep_size = ep;
    std::vector<std::unique_ptr<testing::ChildProcess>> workers;
    for (int node = 1; node < tp; ++node) workers.push_back(start_worker(c, node));
    const std::string name = "tp " + std::to_string(tp) + " x ep " + std::to_string(ep) + " over gloo";
    {
      CommSpec spec = node_rank_spec(tp, tp, 0, 0, addr);
      spec.timeout = std::chrono::seconds(60);
      TensorParallelGroup group(ck, "cpu", 1, make_communicator("gloo", spec), spec.timeout, CompileOptions{}, ep);
      group.create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
      testing::expect_groups_match(model, {&one, &group}, {"tp 1", name});
    }  // tells the workers to stop
    for (auto& w : workers) EXPECT_TRUE(w->succeeded()) << name << ": worker status " << w->wait();
  }
}

TEST(GlooExpertParallelLogits, DeepSeekV3MatchesOneRank) {
  const testing::RandomModel m("deepseek-v3-tiny");
  expect_gloo_moe_logits_match(m.path());
}

TEST(GlooExpertParallelLogits, Qwen3MoeMatchesOneRank) {
  const testing::RandomModel m("qwen3-moe-tiny");
  expect_gloo_moe_logits_match(m.path());
}

// `count` mixed jobs of at most `max_len` prompt tokens and their greedy outputs on one rank (one thread).
struct OneRankReference {
  std::vector<Job> jobs;
  std::vector<std::vector<int32_t>> outputs;
};

OneRankReference one_rank_reference(const std::string& model, int count, int max_len) {
  EngineConfig one = testing::chunked_config(model);
  one.threads = 1;
  Engine engine(one);
  OneRankReference r;
  r.jobs = testing::mixed_jobs(engine.tokenizer(), count, max_len);
  // A byte-level tokenizer's long prompts may not fit a tiny model's context: those are left out.
  std::erase_if(r.jobs, [&](const testing::Job& j) {
    return static_cast<int64_t>(j.prompt.size()) + j.max_tokens > engine.model_config().context_length;
  });
  r.outputs = testing::run_greedy(engine, r.jobs, true);
  return r;
}

// Draft trees on the tp 2 group: the worker gets each tree mask with its step and the accepted path's K/V move.
struct Tree {
  std::string algorithm;  // empty: no speculation
  std::string head;       // EAGLE's head (tests/data path), or empty (MTP)
};

void expect_gloo_greedy_identical(const std::string& model, int ep_size = 1, const Tree& tree = {}) {
  const auto [jobs, reference] = one_rank_reference(model, 16, 40);
  const std::string addr = fresh_addr();
  EngineConfig two = gloo_config(model, 0, addr);
  two.ep_size = ep_size;
  if (!tree.algorithm.empty()) {
    two.speculative_algorithm = parse_speculative_algorithm(tree.algorithm);
    if (!tree.head.empty()) two.speculative_draft_model = testing::data_path(tree.head);
    two.speculative_num_steps = 3;
    two.speculative_eagle_topk = 2;
    two.speculative_num_draft_tokens = 6;
  }
  auto worker = start_worker(two);
  {
    Engine engine(two);
    const auto outs = testing::run_greedy(engine, jobs, true);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i], reference[i]) << model << ": request " << i;
    const EngineStats s = engine.stats();
    EXPECT_GT(s.comm_seconds, 0.0);
    EXPECT_GT(s.forward_seconds, s.comm_seconds);
    EXPECT_EQ(s.kv_blocks_used, 0);
    // Per kind from rank 0's records (a step's reach the stats with the next message): the model's all-reduces; the
    // step messages' broadcasts are no collective of the model.
    EXPECT_GT(totals_of(s.collectives, CollectiveKind::kAllReduce).bytes, 0);
    EXPECT_EQ(totals_of(s.collectives, CollectiveKind::kAllToAll).calls, 0);
    EXPECT_EQ(totals_of(s.collectives, CollectiveKind::kBroadcast).calls, 0);
    if (!tree.algorithm.empty()) {
      EXPECT_GT(s.spec_draft_tokens, 0) << "the trees were drafted";
    }
  }
  EXPECT_TRUE(worker->succeeded()) << "worker status " << worker->wait();
}

TEST(GlooTensorParallel, StoriesGreedyOutputsIdenticalToOneRank) { expect_gloo_greedy_identical(testing::stories_path()); }

TEST(GlooTensorParallel, RandomLlamaGreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel gqa("tiny-gqa");
  expect_gloo_greedy_identical(gqa.path());
}

// A random head: whole trees rejected, partial paths accepted, K/V moved on both processes' caches (GQA heads split).
TEST(GlooTensorParallel, StoriesGreedyIdenticalWithEagleDraftTrees) {
  expect_gloo_greedy_identical(testing::stories_path(), 1, {"EAGLE", "eagle/stories260K_head"});
}

// The trained MTP layer (MLA: the latent cache whole on each rank): drafts get accepted and their K/V moved.
TEST(GlooTensorParallel, DeepSeekV3MtpGreedyIdenticalWithDraftTrees) {
  const std::string model = testing::data_path("hf_models/deepseek_v3_mtp_tiny");
  SERVETUNE_REQUIRE_FILE(model + "/model.safetensors");
  expect_gloo_greedy_identical(model, 1, {"mtp", ""});
}

TEST(GlooExpertParallel, DeepSeekV3GreedyOutputsIdenticalToOneRankWithEp2) {
  const testing::RandomModel m("deepseek-v3-tiny");
  expect_gloo_greedy_identical(m.path(), 2);
}

// DP attention with `dp` replicas, one process (node) each, the MoE layers split `ep` ways.
EngineConfig gloo_dp_attention_config(const std::string& model, int dp, int ep, const std::string& addr) {
  EngineConfig c = gloo_config(model, 0, addr);
  c.tp_size = dp;
  c.nnodes = dp;
  c.dp_size = dp;
  c.ep_size = ep;
  c.enable_dp_attention = true;
  c.max_running_requests = 8 * dp;
  return c;
}

struct DpLayout {
  int dp = 2, ep = 1;
  bool all_to_all = false;
  int mtp_steps = 0;  // > 0: MTP speculation, the remote replicas' hidden states sent back with their logits
  int mtp_topk = 1;   // > 1: draft trees (their masks and K/V moves sent to the replicas' workers)
};

void expect_gloo_dp_attention_identical(const std::string& model, const std::vector<DpLayout>& layouts) {
  const auto [jobs, reference] = one_rank_reference(model, 12, 24);
  for (const DpLayout& l : layouts) {
    EngineConfig c = gloo_dp_attention_config(model, l.dp, l.ep, fresh_addr());
    if (l.all_to_all) c.moe_a2a_backend = MoeA2aBackend::kDeepep;
    if (l.mtp_steps > 0) {
      c.speculative_algorithm = SpeculativeAlgorithm::kMtp;
      c.speculative_num_steps = l.mtp_steps;
      c.speculative_eagle_topk = l.mtp_topk;
    }
    const std::string name = "dp attention " + std::to_string(l.dp) + " x ep " + std::to_string(l.ep) + " over gloo" +
                             (l.all_to_all ? ", all-to-all" : "") + (l.mtp_steps > 0 ? ", mtp" : "") +
                             (l.mtp_topk > 1 ? " trees" : "");
    auto workers = start_workers(c);
    {
      Engine engine(c);
      const auto outs = testing::run_greedy(engine, jobs, true);
      for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i], reference[i]) << model << " " << name << ": request " << i;
      engine.shutdown();
      const EngineStats s = engine.stats();
      testing::expect_counted_once(s, model, name);
      EXPECT_EQ(s.kv_blocks_used, 0) << name;
      // Replica 0's MoE collectives (it joins every step): gathered layouts, and reduce-scatters or all-to-alls.
      EXPECT_GT(totals_of(s.collectives, CollectiveKind::kAllGather).calls, 0) << name;
      EXPECT_EQ(totals_of(s.collectives, CollectiveKind::kAllToAll).calls > 0, l.all_to_all) << name;
      if (l.mtp_steps > 0) {
        EXPECT_GT(s.spec_accepted_tokens, 0) << name;
        EXPECT_EQ(s.spec_draft_kv_blocks_used, 0) << name;
      }
    }  // tells the workers to stop
    for (auto& w : workers) EXPECT_TRUE(w->succeeded()) << name << ": worker status " << w->wait();
  }
}

TEST(GlooDpAttention, DeepSeekV3GreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel m("deepseek-v3-tiny");
  expect_gloo_dp_attention_identical(m.path(), {{2, 2, false}, {2, 2, true}, {4, 4, true}});
}

// MTP drafting for every replica in the engine process: the remote replicas' hidden states come back with their
// logits (the trained MTP layer, so drafts are accepted on every replica).
TEST(GlooDpAttention, MtpGreedyOutputsIdenticalToOneRank) {
  const std::string model = testing::data_path("hf_models/deepseek_v3_mtp_tiny");
  SERVETUNE_REQUIRE_FILE(model + "/model.safetensors");
  expect_gloo_dp_attention_identical(model, {{2, 1, false, 2}, {2, 2, true, 1}, {2, 1, false, 3, 2}});
}

TEST(GlooDpAttention, Qwen3MoeGreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel m("qwen3-moe-tiny");
  expect_gloo_dp_attention_identical(m.path(), {{2, 1, false}, {4, 2, false}});
}

// Runs `make` and returns the Error it throws (fails the test when it does not).
template <class F>
Error expect_error(F&& make) {
  try {
    make();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an error";
  return Error(ErrorKind::kInternal, "");
}

TEST(GlooTensorParallel, WorkerThatNeverStartsIsAClearErrorWithinTheTimeout) {
  EngineConfig c = gloo_config(testing::stories_path(), 0, fresh_addr());
  c.dist_timeout = 2;
  const Error e = expect_error([&] { Engine engine(c); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  EXPECT_NE(std::string(e.what()).find("communicator gloo rank 0 of 2: rendezvous"), std::string::npos) << e.what();
}

TEST(GlooTensorParallel, WorkerKilledMidRunFailsTheRequestsWithAClearError) {
  const std::string addr = fresh_addr();
  auto worker = start_worker(gloo_config(testing::stories_path(), 1, addr));
  Engine engine(gloo_config(testing::stories_path(), 0, addr));
  const auto jobs = testing::mixed_jobs(engine.tokenizer(), 4, 8);
  testing::run_greedy(engine, jobs, true);
  worker->kill();
  worker->wait();
  for (int attempt = 0; attempt < 2; ++attempt) {  // the group stays broken: the second request fails at once
    const std::string error = final_error(testing::submit_greedy(engine, jobs[0], true));
    EXPECT_NE(error.find("engine step failed: communicator gloo rank 0 of 2"), std::string::npos) << error;
  }
}

TEST(GlooTensorParallel, IdleLongerThanTheTimeoutKeepsTheWorker) {
  expect_idle_keeps_workers(gloo_config(testing::stories_path(), 0, fresh_addr()));
}

TEST(GlooTensorParallel, WorkerWithAnotherModelIsRefused) {
  const testing::RandomModel gqa("tiny-gqa");
  const std::string addr = fresh_addr();
  auto worker = start_worker(gloo_config(gqa.path(), 1, addr));
  const Error e = expect_error([&] { Engine engine(gloo_config(testing::stories_path(), 0, addr)); });
  EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("tensor-parallel rank 1 loaded a model of another shape"), std::string::npos) << e.what();
  EXPECT_FALSE(worker->succeeded());
}

TEST(GlooTensorParallel, SeveralRanksPerNodeNeedAProgramThatCanStartThem) {
  EngineConfig c = gloo_config(testing::stories_path(), 0, fresh_addr());
  c.nnodes = 1;
  c.threads = 2;
  const Error e = expect_error([&] { Engine engine(c); });  // this test binary registers no worker launcher
  EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("tp_size / nnodes = 2 ranks per node need worker processes"), std::string::npos) << e.what();
}

TEST(GlooDpAttention, AReplicaThatNeverStartsIsAClearErrorWithinTheTimeout) {
  const testing::RandomModel m("deepseek-v3-tiny");
  EngineConfig c = gloo_dp_attention_config(m.path(), 2, 2, fresh_addr());
  c.dist_timeout = 2;
  const Error e = expect_error([&] { Engine engine(c); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  EXPECT_NE(std::string(e.what()).find("communicator gloo rank 0 of 2: rendezvous"), std::string::npos) << e.what();
}

TEST(GlooDpAttention, AReplicaWithAnotherSplitIsRefused) {
  const testing::RandomModel m("deepseek-v3-tiny");
  const std::string addr = fresh_addr();
  EngineConfig worker = gloo_dp_attention_config(m.path(), 2, 2, addr);
  worker.moe_a2a_backend = MoeA2aBackend::kDeepep;  // the engine gathers; this replica would dispatch all-to-all
  auto workers = start_workers(worker);
  const Error e = expect_error([&] { Engine engine(gloo_dp_attention_config(m.path(), 2, 2, addr)); });
  EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("rank 1 loaded a model of another shape"), std::string::npos) << e.what();
  EXPECT_FALSE(workers[0]->succeeded());
}

// The killed replica's requests and the other replica's, whose MoE layers wait for it, fail with the group's error;
// nothing hangs, and the engine refuses nothing silently afterwards: every later request fails too.
TEST(GlooDpAttention, AReplicaKilledMidRunFailsTheRequestsWithAClearError) {
  const testing::RandomModel m("deepseek-v3-tiny");
  EngineConfig c = gloo_dp_attention_config(m.path(), 2, 2, fresh_addr());
  c.dist_timeout = 10;
  auto workers = start_workers(c);
  Engine engine(c);
  const auto jobs = testing::mixed_jobs(engine.tokenizer(), 4, 8);
  testing::run_greedy(engine, jobs, true);
  workers[0]->kill();
  workers[0]->wait();
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int r = 0; r < 2; ++r) streams.push_back(testing::submit_greedy(engine, jobs[static_cast<size_t>(r)], true));
    for (auto& stream : streams) {
      const std::string error = final_error(stream);
      EXPECT_NE(error.find("engine step failed: communicator gloo rank"), std::string::npos) << error;
    }
  }
}

TEST(GlooDpAttention, IdleLongerThanTheTimeoutKeepsTheWorkers) {
  const testing::RandomModel m("qwen3-moe-tiny");
  expect_idle_keeps_workers(gloo_dp_attention_config(m.path(), 2, 1, fresh_addr()));
}

#ifdef SERVETUNE_BIN
TEST(GlooTensorParallelCli, NodeProcessStartsItsOtherRanksAndMatchesOneRank) {
  const std::string common = "generate -m " + testing::stories_path() + " --prompt 'Once upon a time' --max-tokens 40 --json --threads 2";
  const auto one = testing::servetune(common);
  const auto two = testing::servetune(common + " --tp-size 2 --comm-backend gloo --dist-init-addr " + fresh_addr());
  ASSERT_EQ(one.code, 0) << one.output;
  ASSERT_EQ(two.code, 0) << two.output;
  const auto ids = [](const std::string& out) { return nlohmann::json::parse(out.substr(out.rfind("\n{") + 1))["output_ids"]; };
  EXPECT_EQ(ids(two.output), ids(one.output));
  EXPECT_EQ(ids(one.output).size(), 40u);
}

TEST(GlooDpAttentionCli, NodeProcessStartsItsOtherReplicaAndMatchesOneRank) {
  const testing::RandomModel m("deepseek-v3-tiny");
  const std::string common = "generate -m " + m.path() + " --prompt 'Once upon a time' --max-tokens 24 --json --threads 2";
  const auto one = testing::servetune(common);
  const auto two = testing::servetune(common + " --tp-size 2 --dp-size 2 --enable-dp-attention --ep-size 2 --comm-backend gloo "
                                      "--dist-init-addr " + fresh_addr());
  ASSERT_EQ(one.code, 0) << one.output;
  ASSERT_EQ(two.code, 0) << two.output;
  const auto ids = [](const std::string& out) { return nlohmann::json::parse(out.substr(out.rfind("\n{") + 1))["output_ids"]; };
  EXPECT_EQ(ids(two.output), ids(one.output));
  EXPECT_EQ(ids(one.output).size(), 24u);
}
#endif

}  // namespace
}  // namespace servetune
