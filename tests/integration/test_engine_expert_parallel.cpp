// Tensor and expert parallelism of the mixture-of-experts family over the local communicator, on make-model's
// deepseek-v3-tiny (MLA, a dense first layer, a shared expert, grouped routing with a selection bias) and
// qwen3-moe-tiny (GQA 8:1 with per-head q/k norm), and on llama.cpp's GGUF conversions of DeepSeek-V3, Qwen2-MoE
// and Mixtral (stacked experts): logits of tp 2, ep 2 (tp 2), tp 4 x ep 2 and ep 4 (tp 4) within
// 1e-5 relative of one rank and the same greedy picks, also when a router bias sends every token to the experts of
// one rank; greedy engine outputs identical to tp 1, with every token's routing counted once; bad splits are clear
// usage errors. DP attention (tp = dp replicas, the MoE layers over all of them): logits of two replicas within 1e-5
// of one rank (one replica idle part of the time), greedy engine outputs identical to tp 1 with preemption and
// prefix hits on either replica, an idle replica running empty batches, unsupported combinations named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <nlohmann/json.hpp>

#include "comm/local_communicator.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "model/checkpoint.h"
#include "model/make_model.h"
#include "runtime/tensor_parallel_group.h"
#include "servetune/engine.h"
#include "servetune/model_info.h"
#include "integration/greedy_jobs.h"
#include "integration/moe_counters.h"
#include "integration/random_model.h"
#include "integration/tp_logits.h"
#include "test_paths.h"

namespace servetune {
namespace {

struct Layout {
  int tp;
  int ep;
};
const std::vector<Layout> kLayouts = {{2, 1}, {2, 2}, {4, 2}, {4, 4}};

std::string name_of(const Layout& l) { return "tp " + std::to_string(l.tp) + " x ep " + std::to_string(l.ep); }

// Runs tp 1 and each layout (local communicator, one thread per rank) through expect_groups_match; returns the groups
// so a test can read their counters.
std::vector<std::unique_ptr<TensorParallelGroup>> expect_logits_match(const std::string& model, const std::string& label) {
  const Checkpoint ck(model, LoadFormat::kAuto);
  std::vector<std::unique_ptr<TensorParallelGroup>> owned;
  std::vector<TensorParallelGroup*> groups;
  std::vector<std::string> names = {"tp 1"};
  owned.push_back(std::make_unique<TensorParallelGroup>(ck, "cpu", 1, 1));
  for (const Layout& l : kLayouts) {
    owned.push_back(std::make_unique<TensorParallelGroup>(ck, "cpu", l.tp, 1, CompileOptions{}, kDefaultCommTimeout, l.ep));
    names.push_back(name_of(l));
  }
  for (auto& g : owned) {
    g->create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
    groups.push_back(g.get());
  }
  testing::expect_groups_match(label, groups, names);
  return owned;
}

TEST(ExpertParallelLogits, DeepSeekV3MatchesOneRank) {
  const testing::RandomModel m("deepseek-v3-tiny");
  expect_logits_match(m.path(), "deepseek-v3-tiny");
}

TEST(ExpertParallelLogits, Qwen3MoeMatchesOneRank) {
  const testing::RandomModel m("qwen3-moe-tiny");
  expect_logits_match(m.path(), "qwen3-moe-tiny");
}

// llama.cpp's conversions (tests/data/gguf_moe, f32): stacked [experts, rows, cols] expert tensors read one
// expert's slice at a time, DeepSeek's kv_b as attn_k_b / attn_v_b split by heads, Qwen2-MoE's gated shared expert
// and q/k/v biases.
TEST(ExpertParallelLogits, GgufConversionsMatchOneRank) {
  for (const std::string model : {"deepseek_v3_tiny", "qwen2_moe_tiny", "mixtral_tiny"}) {
    expect_logits_match(testing::data_path("gguf_moe/" + model + ".gguf"), model + ".gguf");
  }
}

// Sets every MoE layer's selection bias of deepseek-v3-tiny at `dir` to +1 for experts 0-3 (group 0) and 0 for the
// others: with sigmoid scores in (0, 1) group 0 always ranks first and its four experts are the top 4, so every token
// goes to the experts of expert-parallel group 0 (rank 0 of ep 4; ranks 0-1 of tp 4 x ep 2).
void bias_to_first_experts(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::vector<std::pair<uint64_t, int64_t>> at;  // file offset, values
    {
      const SafetensorsFile file(entry.path().string());
      for (const SafetensorsTensor& t : file.tensors()) {
        if (t.name.ends_with("mlp.gate.e_score_correction_bias")) {
          ASSERT_EQ(t.dtype, DType::kF32);
          at.emplace_back(file.data_offset() + t.offset, t.n_elements());
        }
      }
    }
    std::fstream out(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (const auto& [offset, n] : at) {
      std::vector<float> bias(static_cast<size_t>(n), 0.0f);
      std::fill_n(bias.begin(), 4, 1.0f);
      out.seekp(static_cast<std::streamoff>(offset));
      out.write(reinterpret_cast<const char*>(bias.data()), static_cast<std::streamsize>(bias.size() * sizeof(float)));
    }
    ASSERT_TRUE(out.good());
    ASSERT_EQ(at.size(), 4u);  // layers 1-3 (layer 0 is dense) and the multi-token-prediction layer
  }
}

TEST(ExpertParallelLogits, EveryTokenOnOneRanksExpertsMatchesOneRank) {
  const testing::RandomModel m("deepseek-v3-tiny");
  bias_to_first_experts(m.path());
  const auto groups = expect_logits_match(m.path(), "deepseek-v3-tiny, all tokens to experts 0-3");
  // Every token went to the four experts of group 0: the busiest expert of each layer and step had all of the tokens.
  const ExpertLoad one = groups[0]->model(0).expert_load();
  EXPECT_GT(one.routed, 0);
  EXPECT_EQ(one.busiest * 4, one.routed);
  // Every rank routes every token and counts it the same; the engine reads rank 0's counters.
  for (const auto& g : groups) {
    for (int r = 0; r < g->size(); ++r) {
      EXPECT_EQ(g->model(r).expert_load().routed, one.routed);
      EXPECT_EQ(g->model(r).expert_load().busiest, one.busiest);
      // Every assignment in the first expert-parallel group's range: that group is the busiest with all of them.
      EXPECT_EQ(g->model(r).expert_load().busiest_group, one.routed);
    }
  }
  EXPECT_EQ(groups.back()->model(0).expert_load().ep_groups, kLayouts.back().ep);
}

// An --init-expert-location file with the load bias_to_first_experts gives every MoE layer: experts 0-3 all of it.
std::string first_experts_hot_location(const std::string& model) {
  const Checkpoint ck(model, LoadFormat::kAuto);
  const MoeConfig& moe = ck.config().moe;
  std::vector<int64_t> row(static_cast<size_t>(moe.routing.n_experts), 0);
  std::fill_n(row.begin(), 4, 1000);
  const std::vector<std::vector<int64_t>> counts(
      static_cast<size_t>(std::count(moe.moe_layer.begin(), moe.moe_layer.end(), true)), row);
  const std::string path = model + "/hot_first_experts.json";
  std::ofstream(path) << nlohmann::json{{"logical_count", counts}}.dump();
  return path;
}

ExpertSplit with_redundant(int ep, int redundant, const std::string& location = "trivial") {
  ExpertSplit s(ep);
  s.redundant_experts = redundant;
  s.expert_location = location;
  return s;
}

// Redundant experts (EPLB), every token routed to experts 0-3 (all in group 0 of ep 4 without copies): copies in the
// trivial placement and in the one EPLB makes from that load; logits within 1e-5 of one rank, the expert
// distribution one rank's, and with the load-based placement the busiest group gets at most a third of the
// assignments (all of them without copies: EveryTokenOnOneRanksExpertsMatchesOneRank).
TEST(ExpertParallelLogits, RedundantExpertsMatchOneRankAndSpreadAHotGroup) {
  const testing::RandomModel m("deepseek-v3-tiny");
  bias_to_first_experts(m.path());
  const std::string hot = first_experts_hot_location(m.path());
  const Checkpoint ck(m.path(), LoadFormat::kAuto);
  std::vector<std::unique_ptr<TensorParallelGroup>> owned;
  owned.push_back(std::make_unique<TensorParallelGroup>(ck, "cpu", 1, 1));
  const std::vector<std::pair<int, ExpertSplit>> splits = {
      {2, with_redundant(2, 2)}, {4, with_redundant(4, 4, hot)}, {4, with_redundant(2, 2, hot)}};
  std::vector<std::string> names = {"tp 1"};
  for (const auto& [tp, split] : splits) {
    owned.push_back(std::make_unique<TensorParallelGroup>(ck, "cpu", tp, 1, CompileOptions{}, kDefaultCommTimeout, split));
    names.push_back("tp " + std::to_string(tp) + " x ep " + std::to_string(split.ep_size) + " + " +
                    std::to_string(split.redundant_experts) + " redundant, " + split.expert_location);
  }
  std::vector<TensorParallelGroup*> groups;
  for (auto& g : owned) {
    g->create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
    groups.push_back(g.get());
  }
  testing::expect_groups_match("deepseek-v3-tiny, all tokens to experts 0-3", groups, names);
  const ExpertLoad one = owned[0]->model(0).expert_load();
  ASSERT_GT(one.routed, 0);
  for (size_t i = 1; i < owned.size(); ++i) {
    const ExpertLoad load = owned[i]->model(0).expert_load();
    EXPECT_EQ(load.routed, one.routed) << names[i];
    EXPECT_EQ(load.busiest, one.busiest) << names[i];  // per logical expert, whichever copies served it
    EXPECT_EQ(owned[i]->model(0).expert_distribution(), owned[0]->model(0).expert_distribution()) << names[i];
  }
  const ExpertLoad spread = owned[2]->model(0).expert_load();
  EXPECT_EQ(spread.ep_groups, 4);
  // Each group holds copies of two of the hot experts, and a token's assignments take copies in turn by token, so
  // the busiest group gets a bit over a quarter (about half if every token used an expert's first copy).
  EXPECT_LE(spread.busiest_group * 3, spread.routed) << spread.busiest_group << " of " << spread.routed;
}

void expect_usage_error(const EngineConfig& c, const std::vector<std::string>& words);

// DP attention at the model level: two replica groups (tp 1 each, their MoE layers joined by one communicator) run
// sequences {0, 2} and {1} of three in lockstep, replica 1 with nothing left from step 10 on (its idle batches still
// serve replica 0's tokens); every logits row within 1e-5 relative of one rank running all three, same greedy pick.
// `all_to_all`: the MoE layers dispatch tokens to their experts' ranks instead of gathering them.
void expect_dp_attention_logits_match(const std::string& model, const ExpertSplit& ep, bool all_to_all = false) {
  const Checkpoint ck(model, LoadFormat::kAuto);
  TensorParallelGroup one(ck, "cpu", 1, 1);
  const auto group = LocalGroup::create(2, std::chrono::seconds(60));
  TensorParallelGroup r0(ck, "cpu", 1, 1, CompileOptions{}, kDefaultCommTimeout, ep, group->communicator(0), all_to_all);
  TensorParallelGroup r1(ck, "cpu", 1, 1, CompileOptions{}, kDefaultCommTimeout, ep, group->communicator(1), all_to_all);
  for (TensorParallelGroup* g : {&one, &r0, &r1}) g->create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
  const int64_t vocab = one.model(0).config().vocab;
  std::vector<testing::SeqState> seqs(3);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int k = 0; k < 5 + 9 * static_cast<int>(i); ++k) seqs[i].tokens.push_back(3 + (static_cast<int>(i) * 37 + k * 11) % 250);
    seqs[i].first_block = static_cast<int32_t>(i * testing::kLogitsMaxBlocks);
  }
  const std::vector<std::vector<size_t>> replica_seqs = {{0, 2}, {1}};
  int64_t rows = 0;
  for (int step = 0; step < 16; ++step) {
    const auto active = [&](size_t i) { return i != 1 || step < 10; };  // replica 1's request ends: idle from step 10
    std::vector<testing::SeqState> mine[2], every;
    for (int r = 0; r < 2; ++r) {
      for (size_t i : replica_seqs[static_cast<size_t>(r)]) {
        if (active(i)) mine[r].push_back(seqs[i]);
      }
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (active(i)) every.push_back(seqs[i]);
    }
    const Batch all = testing::next_batch(every, 8, testing::kLogitsMaxBlocks);
    const Batch b0 = testing::next_batch(mine[0], 8, testing::kLogitsMaxBlocks);
    const Batch b1 = testing::next_batch(mine[1], 8, testing::kLogitsMaxBlocks);
    std::vector<float> ref, l0, l1;
    one.forward(all, ref);
    std::thread other([&] {
      if (b1.n_tokens() > 0) r1.forward(b1, l1);
      else r1.forward_idle();
    });
    r0.forward(b0, l0);
    other.join();
    // Each sampling sequence's row: in the reference in sequence order, in its replica in that replica's order.
    size_t ref_row = 0, rows0 = 0, rows1 = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      testing::SeqState& s = seqs[i];
      const int64_t end = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()), s.computed + 8);
      const bool sampled = end == static_cast<int64_t>(s.tokens.size()) && end > s.computed;
      const bool on_one = i == 1;
      if (!active(i)) continue;
      s.computed = end;
      if (!sampled) continue;
      const float* want = ref.data() + ref_row++ * static_cast<size_t>(vocab);
      const float* got = on_one ? l1.data() + rows1++ * static_cast<size_t>(vocab) : l0.data() + rows0++ * static_cast<size_t>(vocab);
      float scale = 0.0f, diff = 0.0f;
      for (int64_t v = 0; v < vocab; ++v) {
        scale = std::max(scale, std::fabs(want[v]));
        diff = std::max(diff, std::fabs(want[v] - got[v]));
      }
      EXPECT_LE(diff / std::max(scale, 1e-30f), 1e-5)
          << model << " ep " << ep.ep_size << " + " << ep.redundant_experts << " redundant" << (all_to_all ? " all-to-all" : "")
          << " step " << step << " sequence " << i;
      EXPECT_EQ(std::max_element(got, got + vocab) - got, std::max_element(want, want + vocab) - want) << "step " << step;
      s.tokens.push_back(static_cast<int32_t>(std::max_element(want, want + vocab) - want));
      ++rows;
    }
  }
  EXPECT_GT(rows, 30);
}

// A replica whose step fails (here a batch asking for a logits row it does not have) aborts the replicas'
// communicator: the other one, waiting in its first MoE gather, fails at once with that replica's error instead of
// waiting out the 60 s timeout, and the group stays broken (idle batches throw too).
TEST(DpAttentionLogits, AFailingReplicaFailsTheOtherAtOnce) {
  const testing::RandomModel m("deepseek-v3-tiny");
  const Checkpoint ck(m.path(), LoadFormat::kAuto);
  const auto group = LocalGroup::create(2, std::chrono::seconds(60));
  TensorParallelGroup r0(ck, "cpu", 1, 1, CompileOptions{}, kDefaultCommTimeout, 2, group->communicator(0));
  TensorParallelGroup r1(ck, "cpu", 1, 1, CompileOptions{}, kDefaultCommTimeout, 2, group->communicator(1));
  for (TensorParallelGroup* g : {&r0, &r1}) g->create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
  std::vector<testing::SeqState> seqs(1);
  seqs[0].tokens = {3, 4, 5, 6};
  const Batch good = testing::next_batch(seqs, 8, testing::kLogitsMaxBlocks);
  Batch bad = good;
  bad.logits_indices = {99};
  const auto start = std::chrono::steady_clock::now();
  std::string other_error;
  std::thread other([&] {
    std::vector<float> logits;
    try {
      r1.forward(bad, logits);
    } catch (const std::exception& e) {
      other_error = e.what();
    }
  });
  std::vector<float> logits;
  try {
    r0.forward(good, logits);
    ADD_FAILURE() << "replica 0's step should fail with replica 1's";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("replica 1 failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("logits index out of range"), std::string::npos) << e.what();
  }
  other.join();
  EXPECT_NE(other_error.find("logits index out of range"), std::string::npos) << other_error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_THROW(r0.forward_idle(), Error);
}

// A replica that never arrives (its thread never steps): the other fails in its first MoE collective within the
// replicas' timeout, naming it, instead of hanging; with either MoE scheme.
TEST(DpAttentionLogits, AReplicaThatNeverArrivesFailsTheOtherWithinTheTimeout) {
  const testing::RandomModel m("deepseek-v3-tiny");
  const Checkpoint ck(m.path(), LoadFormat::kAuto);
  for (const bool all_to_all : {false, true}) {
    const auto group = LocalGroup::create(2, std::chrono::seconds(1));
    TensorParallelGroup r0(ck, "cpu", 1, 1, CompileOptions{}, kDefaultCommTimeout, 2, group->communicator(0), all_to_all);
    r0.create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
    std::vector<testing::SeqState> seqs(1);
    seqs[0].tokens = {3, 4, 5, 6};
    const Batch batch = testing::next_batch(seqs, 8, testing::kLogitsMaxBlocks);
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> logits;
    try {
      r0.forward(batch, logits);
      ADD_FAILURE() << "replica 0 should fail without replica 1";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("timed out after 1000 ms waiting for rank(s) 1"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << (all_to_all ? "all-to-all" : "gather");
  }
}

TEST(DpAttentionLogits, DeepSeekV3AndQwen3MoeMatchOneRank) {
  for (const std::string preset : {"deepseek-v3-tiny", "qwen3-moe-tiny"}) {
    const testing::RandomModel m(preset);
    expect_dp_attention_logits_match(m.path(), 1);
    expect_dp_attention_logits_match(m.path(), 2);
  }
}

// All-to-all dispatch: ep 2 (each rank owns half the experts, whole), ep 1 (each rank owns every expert's half of the
// intermediate dimension, so every token goes to both); and every token routed to rank 0's experts (rank 1 receives
// nothing and sends its tokens away).
TEST(DpAttentionLogits, AllToAllDispatchMatchesOneRank) {
  for (const std::string preset : {"deepseek-v3-tiny", "qwen3-moe-tiny"}) {
    const testing::RandomModel m(preset);
    expect_dp_attention_logits_match(m.path(), 2, true);
    expect_dp_attention_logits_match(m.path(), 1, true);
  }
  const testing::RandomModel skewed("deepseek-v3-tiny");
  bias_to_first_experts(skewed.path());
  expect_dp_attention_logits_match(skewed.path(), 2, true);
}

// Redundant experts under DP attention: copies chosen by each replica's own tokens (all-to-all) or by the gathered
// tokens (every rank the same), trivially placed and placed by the load of every token going to experts 0-3.
TEST(DpAttentionLogits, RedundantExpertsMatchOneRank) {
  const testing::RandomModel plain("qwen3-moe-tiny");
  expect_dp_attention_logits_match(plain.path(), with_redundant(2, 2), true);
  const testing::RandomModel skewed("deepseek-v3-tiny");
  bias_to_first_experts(skewed.path());
  const std::string hot = first_experts_hot_location(skewed.path());
  expect_dp_attention_logits_match(skewed.path(), with_redundant(2, 2, hot), false);
  expect_dp_attention_logits_match(skewed.path(), with_redundant(2, 4, hot), true);
}

EngineConfig config_for(const std::string& model, int tp, int ep) {
  EngineConfig c = testing::chunked_config(model);
  c.threads = std::max(2, tp);
  c.tp_size = tp;
  c.ep_size = ep;
  return c;
}

// `count` mixed jobs (chunked prefill, shared prefixes) and their greedy outputs on one rank: what every layout must
// reproduce.
struct OneRankReference {
  std::vector<testing::Job> jobs;
  std::vector<std::vector<int32_t>> outputs;
};

OneRankReference one_rank_reference(const std::string& model, int count) {
  OneRankReference r;
  Engine engine(config_for(model, 1, 1));
  r.jobs = testing::mixed_jobs(engine.tokenizer(), count, 24);
  r.outputs = testing::run_greedy(engine, r.jobs, true);
  testing::expect_counted_once(engine.stats(), model, "tp 1");
  return r;
}

// Greedy outputs of a mixed batch with chunked prefill identical to tp 1, and the expert-load counters counted once.
void expect_greedy_identical(const std::string& model, const std::vector<Layout>& layouts) {
  const auto [jobs, reference] = one_rank_reference(model, 8);
  for (const Layout& l : layouts) {
    Engine engine(config_for(model, l.tp, l.ep));
    const auto outs = testing::run_greedy(engine, jobs, true);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i], reference[i]) << model << " " << name_of(l) << ": request " << i;
    const EngineStats s = engine.stats();
    testing::expect_counted_once(s, model, name_of(l));
    EXPECT_GT(s.comm_seconds, 0.0) << name_of(l);
  }
}

TEST(EngineExpertParallel, DeepSeekV3GreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel m("deepseek-v3-tiny");
  expect_greedy_identical(m.path(), {{2, 2}, {4, 4}});
}

TEST(EngineExpertParallel, Qwen3MoeGreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel m("qwen3-moe-tiny");
  expect_greedy_identical(m.path(), {{2, 1}, {4, 2}});
}

// DP attention (tp = dp): each replica's attention and cache on its own rank, the MoE layers over all of them.
EngineConfig dp_attention_config(const std::string& model, int dp, int ep) {
  EngineConfig c = config_for(model, dp, ep);
  c.dp_size = dp;
  c.enable_dp_attention = true;
  c.max_running_requests = 8 * dp;
  return c;
}

void expect_dp_attention_identical(const std::string& model, const std::vector<Layout>& layouts, bool all_to_all = false) {
  const auto [jobs, reference] = one_rank_reference(model, 8);
  for (const Layout& l : layouts) {
    const std::string name =
        "dp attention " + std::to_string(l.tp) + " x ep " + std::to_string(l.ep) + (all_to_all ? ", all-to-all" : "");
    EngineConfig c = dp_attention_config(model, l.tp, l.ep);
    if (all_to_all) c.moe_a2a_backend = MoeA2aBackend::kDeepep;
    Engine engine(c);
    const auto outs = testing::run_greedy(engine, jobs, true);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i], reference[i]) << model << " " << name << ": request " << i;
    engine.shutdown();  // replica 0 (whose expert counters count) may still be in an idle batch of the last step
    const EngineStats s = engine.stats();
    testing::expect_counted_once(s, model, name);
    // Gather: the replicas' tokens gathered before each MoE layer and the sums scattered back. All-to-all: the layouts
    // gathered, the rows dispatched and the sums combined all-to-all.
    EXPECT_GT(s.collectives[static_cast<size_t>(CollectiveKind::kAllGather)].calls, 0) << name;
    EXPECT_EQ(s.collectives[static_cast<size_t>(CollectiveKind::kReduceScatter)].calls > 0, !all_to_all) << name;
    EXPECT_EQ(s.collectives[static_cast<size_t>(CollectiveKind::kAllToAll)].calls > 0, all_to_all) << name;
    EXPECT_EQ(s.collectives[static_cast<size_t>(CollectiveKind::kAllReduce)].calls, 0) << name;
  }
}

TEST(EngineDpAttention, DeepSeekV3GreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel m("deepseek-v3-tiny");
  expect_dp_attention_identical(m.path(), {{2, 2}, {4, 4}, {4, 1}});
}

TEST(EngineDpAttention, Qwen3MoeGreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel m("qwen3-moe-tiny");
  expect_dp_attention_identical(m.path(), {{2, 1}, {4, 2}});
}

TEST(EngineDpAttention, AllToAllDispatchGreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel deepseek("deepseek-v3-tiny");
  expect_dp_attention_identical(deepseek.path(), {{2, 2}, {4, 4}, {4, 2}}, true);
  const testing::RandomModel qwen("qwen3-moe-tiny");
  expect_dp_attention_identical(qwen.path(), {{2, 1}, {4, 4}}, true);
}

// Redundant experts through the engine, placed by the distribution the one-rank engine measured (Engine's
// expert_distribution, as bench --expert-distribution-out writes it) and trivially: tensor-parallel expert
// parallelism, and DP attention with all-to-all dispatch; greedy outputs identical to one rank.
TEST(EngineExpertParallel, RedundantExpertsGreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel m("deepseek-v3-tiny");
  std::vector<testing::Job> jobs;
  std::vector<std::vector<int32_t>> reference;
  const std::string measured = m.path() + "/measured_location.json";
  {
    Engine engine(config_for(m.path(), 1, 1));
    jobs = testing::mixed_jobs(engine.tokenizer(), 8, 24);
    reference = testing::run_greedy(engine, jobs, true);
    engine.shutdown();
    const auto counts = engine.expert_distribution();
    ASSERT_EQ(counts.size(), 3u);  // layers 1-3 (layer 0 is dense)
    const EngineStats s = engine.stats();
    for (const auto& row : counts) EXPECT_EQ(std::accumulate(row.begin(), row.end(), int64_t{0}), s.moe_routed_tokens / 3);
    std::ofstream(measured) << nlohmann::json{{"logical_count", counts}}.dump();
  }
  EngineConfig tp = config_for(m.path(), 2, 2);
  tp.ep_num_redundant_experts = 2;
  tp.init_expert_location = measured;
  EngineConfig dp = dp_attention_config(m.path(), 2, 2);
  dp.moe_a2a_backend = MoeA2aBackend::kDeepep;
  dp.ep_num_redundant_experts = 4;
  for (const EngineConfig& c : {tp, dp}) {
    const std::string name = c.enable_dp_attention ? "dp attention, all-to-all, 4 redundant" : "tp 2 x ep 2, 2 redundant, measured";
    Engine engine(c);
    const auto outs = testing::run_greedy(engine, jobs, true);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i], reference[i]) << name << ": request " << i;
    engine.shutdown();
    testing::expect_counted_once(engine.stats(), m.path(), name);
  }
}

// One request: the other replica has nothing to schedule and runs an empty batch at every step (its experts' share
// of the busy replica's tokens), so the collectives never wait for it; the engine then shuts down at once.
TEST(EngineDpAttention, IdleReplicaRunsEmptyBatches) {
  const testing::RandomModel m("deepseek-v3-tiny");
  const OneRankReference one = one_rank_reference(m.path(), 2);
  std::vector<testing::Job> jobs = {one.jobs[1]};  // 12 new tokens
  const std::vector<int32_t>& reference = one.outputs[1];
  Engine engine(dp_attention_config(m.path(), 2, 2));
  EXPECT_EQ(testing::run_greedy(engine, jobs, true)[0], reference);
  // Requests after the first run too, on either replica (round robin: the next goes to the idle one).
  jobs.push_back(jobs[0]);
  const auto twice = testing::run_greedy(engine, jobs, true);
  EXPECT_EQ(twice[0], reference);
  EXPECT_EQ(twice[1], reference);
  engine.shutdown();  // replica 0 (whose counters count) may still be in an idle batch of the last step
  const EngineStats s = engine.stats();
  testing::expect_counted_once(s, m.path(), "one request, then two");
  EXPECT_EQ(s.requests_finished, 3);
  // While one replica had the only request, the other joined each of its steps with an empty batch (its prefill
  // chunks, then a decode per token).
  EXPECT_GE(s.idle_batches, jobs[0].max_tokens);
  EXPECT_LE(s.idle_batches, s.steps);
}

// A KV cache so small per replica that its requests preempt each other, on both replicas or one; then the same
// requests again shifted by one replica (an extra request first), so each replica meets prompts whose prefixes the
// other one cached (prefix hits on one, misses on the other): outputs stay those of tp 1 throughout.
TEST(EngineDpAttention, PreemptionAndPrefixCacheOnEachReplicaKeepOutputs) {
  const testing::RandomModel m("deepseek-v3-tiny");
  const auto [jobs, reference] = one_rank_reference(m.path(), 8);
  EngineConfig c = dp_attention_config(m.path(), 2, 2);
  c.max_total_tokens = 640;  // 320 tokens per replica: its four requests of up to 259 tokens each do not fit at once
  c.page_size = 8;
  Engine engine(c);
  EXPECT_EQ(testing::run_greedy(engine, jobs, true), reference);
  std::vector<testing::Job> shifted = {jobs[3]};
  shifted.insert(shifted.end(), jobs.begin(), jobs.end());
  const auto again = testing::run_greedy(engine, shifted, true);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(again[i + 1], reference[i]) << "second pass, request " << i;
  engine.shutdown();
  const EngineStats s = engine.stats();
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.prefix_hit_tokens, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

TEST(EngineDpAttention, UnsupportedCombinationsAreClearErrors) {
  const testing::RandomModel moe("qwen3-moe-tiny");
  EngineConfig c = dp_attention_config(moe.path(), 2, 1);
  c.dp_size = 1;
  expect_usage_error(c, {"enable_dp_attention", "needs dp_size > 1"});
  c = dp_attention_config(moe.path(), 4, 1);
  c.dp_size = 2;
  try {
    Engine engine(c);
    ADD_FAILURE() << "expected an error for dp 2 < tp 4";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("use dp_size = tp_size"), std::string::npos) << e.what();
  }
  const testing::RandomModel dense("tiny");
  expect_usage_error(dp_attention_config(dense.path(), 2, 1), {"DP attention", "llama model has none"});
  c = config_for(moe.path(), 2, 2);
  c.moe_a2a_backend = MoeA2aBackend::kDeepep;
  try {
    Engine engine(c);
    ADD_FAILURE() << "expected an error for deepep without DP attention";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("moe_a2a_backend deepep"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs enable_dp_attention"), std::string::npos) << e.what();
  }
}

void expect_usage_error(const EngineConfig& c, const std::vector<std::string>& words) {
  try {
    Engine engine(c);
    ADD_FAILURE() << "expected an error for tp " << c.tp_size << " ep " << c.ep_size;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(EngineExpertParallel, SplitsThatDoNotFitAreClearUsageErrors) {
  const testing::RandomModel qwen("qwen3-moe-tiny");
  // ep must divide tp (a combination the tuner skips).
  expect_usage_error(config_for(qwen.path(), 4, 3), {"ep_size = 3 does not divide tp_size = 4"});
  const testing::RandomModel dense("tiny");
  expect_usage_error(config_for(dense.path(), 2, 2), {"ep_size 2 splits routed experts", "llama model has none"});
  // The experts must divide over the groups: qwen3-moe-tiny with 6 experts over ep 4.
  HfModelConfig six = model_preset("qwen3-moe-tiny");
  six.moe.num_experts = 6;
  const std::string dir = (std::filesystem::temp_directory_path() / ("servetune_ep_six_" + std::to_string(::getpid()))).string();
  write_random_model(six, dir, 11, DType::kF32, 0.02f);
  expect_usage_error(config_for(dir, 4, 4), {"ep_size 4 does not divide the model's 6 routed experts"});
  // Redundant slots count: 6 experts + 2 copies fill 4 groups of 2; + 1 copy does not divide.
  EngineConfig with_copies = config_for(dir, 4, 4);
  with_copies.ep_num_redundant_experts = 2;
  EXPECT_NO_THROW(Engine{with_copies});
  with_copies.ep_num_redundant_experts = 1;
  expect_usage_error(with_copies, {"ep_size 4 does not divide the model's 6 routed experts + 1 redundant ones"});
  with_copies.ep_size = 1;
  with_copies.tp_size = 1;
  expect_usage_error(with_copies, {"ep_num_redundant_experts copies hot experts onto other expert-parallel groups; it needs ep_size > 1"});
  with_copies.ep_num_redundant_experts = 0;
  with_copies.init_expert_location = dir + "/location.json";
  expect_usage_error(with_copies, {"init_expert_location places the experts over the expert-parallel groups; it needs ep_size > 1"});
  with_copies.ep_size = 2;
  with_copies.tp_size = 2;
  expect_usage_error(with_copies, {"init_expert_location " + dir + "/location.json: no such file"});
  // The public check the tuner uses says the same without loading weights.
  const ModelInfo info = read_model_info(dir);
  EXPECT_NO_THROW(check_tensor_parallel_split(info, 4, 2));
  try {
    check_tensor_parallel_split(info, 4, 4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("ep_size 4 does not divide the model's 6 routed experts"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_tensor_parallel_split(info, 4, 4, false, 2));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace servetune
