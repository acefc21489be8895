// Search space: stable candidate ids, constraints and validity rules as skip reasons, settings the built-in engine
// rejects, impossible constraints as an error; external servers' flag rendering.
#include <gtest/gtest.h>

#include "core/error.h"
#include "test_paths.h"
#include "tuner/plan.h"
#include "tuner/server_command.h"
#include "tuner/space.h"

namespace servetune::tuner {
namespace {

SweepSpec parse_space_spec(const std::string& text) { return parse_sweep(parse_spec_text(text, "test.yaml")); }

TEST(TunerSpace, IdsAreMixedRadixIndices) {
  const SweepSpec s = parse_space_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 16, 32], disable_radix_cache: [false, true], page_size: 16}
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(s);
  ASSERT_EQ(space.size(), 6u);
  EXPECT_EQ(space.at(0).id, "c0");
  const Candidate c = space.at(3);
  EXPECT_EQ(c.settings["max_running_requests"], 16);
  EXPECT_EQ(c.settings["disable_radix_cache"], true);
  EXPECT_EQ(c.label, "max_running_requests=16, disable_radix_cache=true");  // the fixed page_size is not in labels
  EXPECT_EQ(space.find(c.settings).id, c.id);
  EXPECT_EQ(space.baseline().id, "c0");
  EXPECT_EQ(space.engine_config(c).max_running_requests, 16);
  EXPECT_EQ(space.engine_config(c).model, "m.gguf");
}

TEST(TunerSpace, ConstraintsAndValidityRulesSkipWithAReason) {
  const SweepSpec s = parse_space_spec(R"(name: t
target: {engine: builtin, model: m.gguf, devices: 4}
space: {tp_size: [1, 2, 8], max_running_requests: [8, 64], threads: 8}
constraints: ["max_running_requests >= 16 * tp_size or tp_size != 2"]
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(s);
  EXPECT_EQ(space.at(0).skip_reason, "");                                           // tp 1, 8
  EXPECT_NE(space.at(2).skip_reason.find("constraint"), std::string::npos);          // tp 2, 8
  EXPECT_EQ(space.at(3).skip_reason, "");                                           // tp 2, 64 (m.gguf unread here)
  EXPECT_NE(space.at(5).skip_reason.find("exceeds the 4 devices"), std::string::npos);  // tp 8, 64
}

// DP attention's replicas are the tp_size ranks: tp 4 x dp 4 with it needs 4 devices, without it 16.
TEST(TunerSpace, DpAttentionCountsTheRanksOnce) {
  const SweepSpec s = parse_space_spec(R"(name: t
target: {engine: external, model: m, command: "srv --port {port} {flags}", devices: 4, settings: {tp_size: 4, dp_size: 4}}
space: {enable_dp_attention: [true, false]}
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(s);
  EXPECT_EQ(space.at(0).skip_reason, "");
  EXPECT_NE(space.at(1).skip_reason.find("tp_size x dp_size = 16 exceeds the 4 devices"), std::string::npos) << space.at(1).skip_reason;
}

TEST(TunerSpace, TensorParallelSizesTheModelCannotBeSplitIntoAreSkipped) {
  const SweepSpec s = parse_space_spec(R"(name: t
target: {engine: builtin, model: )" + testing::stories_path() + R"(}
space: {threads: 8, tp_size: [1, 2, 4, 8]}
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(s);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(space.at(i).skip_reason, "") << i;  // stories260K: 8 heads, 4 KV heads, ffn 172
  EXPECT_NE(space.at(3).skip_reason.find("the engine rejects it: tp_size 8 does not divide the model's feed-forward dimension 172"),
            std::string::npos) << space.at(3).skip_reason;
}

TEST(TunerSpace, DataParallelCandidatesThatDoNotFitTheThreadsAreSkipped) {
  const SweepSpec s = parse_space_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {threads: [2], dp_size: [1, 2, 4], load_balance_method: [round_robin, shortest_queue]}
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(s);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(space.at(i).skip_reason, "") << i;  // dp 1, 2
  EXPECT_NE(space.at(4).skip_reason.find("the engine rejects it: tp_size x dp_size = 4 ranks need at least one thread each"),
            std::string::npos) << space.at(4).skip_reason;
}

TEST(TunerSpace, ExpertsMustBeDivisible) {
  const SweepSpec s = parse_space_spec(R"(name: t
target: {engine: external, model: m, tokenizer: t, command: "srv --port {port} {flags}", num_experts: 6}
space: {ep_size: [2, 4]}
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(s);
  EXPECT_EQ(space.at(0).skip_reason, "");
  EXPECT_NE(space.at(1).skip_reason.find("does not divide the 6 experts"), std::string::npos);
}

TEST(TunerSpace, ExpertParallelOnADenseModelIsSkipped) {
  const SweepSpec s = parse_space_spec("name: t\ntarget: {engine: builtin, model: " + testing::stories_path() +
                                       "}\nspace: {threads: [2], tp_size: [2], ep_size: [1, 2]}\n"
                                       "workloads: [{name: w, dataset: random}]\n");
  SearchSpace space(s);
  EXPECT_EQ(space.at(0).skip_reason, "");
  EXPECT_NE(space.at(1).skip_reason.find("the engine rejects it"), std::string::npos) << space.at(1).skip_reason;
  EXPECT_NE(space.at(1).skip_reason.find("ep_size"), std::string::npos) << space.at(1).skip_reason;
}

TEST(TunerSpace, InvalidEngineValuesAndImpossibleConstraintsAreErrors) {
  const SweepSpec bad = parse_space_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [0, 8]}
workloads: [{name: w, dataset: random}]
)");
  try {
    SearchSpace(bad).at(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("max_running_requests must be at least 1"), std::string::npos) << e.what();
  }
  const SweepSpec none = parse_space_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 16]}
constraints: ["max_running_requests > 100"]
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(none);
  try {
    validate_plan(none, space);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("every candidate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 x constraint 'max_running_requests > 100' is false"), std::string::npos) << e.what();
  }
}

TEST(TunerSpace, ExternalFlagsRenderFromTemplatesAndTables) {
  const SweepSpec s = parse_space_spec(R"(name: t
target:
  engine: external
  model: org/model name
  tokenizer: t
  settings: {tp_size: 8}
  servers:
    a:
      command: "serve {model} --port {port} {flags}"
      flags:
        tp_size: "--tp {}"
        spec: {none: "", mtp: "--speculative-config '{{\"n\": {tp_size}}}'"}
        graphs: null
    b:
      command: "other {model} --port={port} {flags}"
space:
  server: [a, b]
  spec: [none, mtp]
  graphs: [false, true]
  max_num_seqs: [64]
  enforce-eager: [true]
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(s);
  std::string why;
  auto cmd = render_launch(s, space.full_settings(space.find({{"server", "a"}, {"spec", "mtp"}})), 9000, why);
  ASSERT_TRUE(cmd) << why;
  EXPECT_EQ(cmd->command, "serve 'org/model name' --port 9000 --tp 8 --speculative-config '{\"n\": 8}' --max-num-seqs 64 --enforce-eager");
  cmd = render_launch(s, space.full_settings(space.find({{"server", "b"}, {"graphs", true}})), 9000, why);
  ASSERT_TRUE(cmd) << why;
  EXPECT_EQ(cmd->command, "other 'org/model name' --port=9000 --tp-size 8 --spec none --graphs --max-num-seqs 64 --enforce-eager");
  EXPECT_NE(space.find({{"server", "a"}, {"graphs", true}}).skip_reason.find("a does not support graphs"), std::string::npos);
}

TEST(TunerSpace, UnknownPlaceholderIsAnError) {
  const SweepSpec s = parse_space_spec(R"(name: t
target: {engine: external, model: m, tokenizer: t, command: "srv --port {port} --gpus {gpus}"}
workloads: [{name: w, dataset: random}]
)");
  try {
    SearchSpace(s).at(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown placeholder {gpus}"), std::string::npos) << e.what();
  }
}

TEST(TunerSpace, ShellQuoting) {
  EXPECT_EQ(shell_quote("abc-1.5/x"), "abc-1.5/x");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
}

}  // namespace
}  // namespace servetune::tuner
