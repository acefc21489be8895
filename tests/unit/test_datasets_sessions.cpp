// Multi-turn workloads: ShareGPT conversations as sessions (history built from the file's own turns, turn caps,
// the length limit that ends a session and says so) and synthetic sessions (determinism, per-turn lengths, the
// shared and per-session prefixes measured on the generated prompts' tokens), on a ChatML tokenizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "datasets/dataset.h"
#include "formats/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune::datasets {
namespace {

const Tokenizer& chatml() {
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::from_hf_dir(testing::data_path("tokenizer/hf/qwen2"));
  return *tok;
}

std::vector<int32_t> ids(const std::string& prompt) { return chatml().encode(prompt, false, true); }

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

// Conversation c has `turns` (user, reply) pairs; user k says "question k of c ..." with `words` filler words.
std::string conversations_file(int conversations, int turns, int words) {
  nlohmann::json file = nlohmann::json::array();
  for (int c = 0; c < conversations; ++c) {
    nlohmann::json conv = nlohmann::json::array();
    for (int k = 0; k < turns; ++k) {
      std::string q = "question " + std::to_string(k) + " of " + std::to_string(c);
      for (int w = 0; w < words; ++w) q += " word";
      conv.push_back({{"from", "human"}, {"value", q}});
      conv.push_back({{"from", "gpt"}, {"value", "answer " + std::to_string(k) + " of " + std::to_string(c) + " is fine"}});
    }
    file.push_back({{"id", std::to_string(c)}, {"conversations", conv}});
  }
  return file.dump();
}

DatasetOptions sharegpt_sessions(const std::string& path) {
  DatasetOptions o;
  o.name = "sharegpt";
  o.path = path;
  o.multi_turn = true;
  o.disable_shuffle = true;
  o.num_prompts = 3;
  return o;
}

TEST(ShareGptSessions, EachTurnSendsTheTemplatedHistoryOfTheFilesOwnReplies) {
  const DatasetOptions o = sharegpt_sessions(testing::temp_file("mt_sessions.json", conversations_file(3, 4, 3)));
  const Workload w = load_workload(o, chatml());
  ASSERT_TRUE(w.sessions);
  EXPECT_EQ(w.history, "dataset");
  ASSERT_EQ(w.requests.size(), 12u);
  EXPECT_EQ(w.info["sessions"].get<int64_t>(), 3);
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const SampleRequest& r = w.requests[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(r.session, static_cast<int64_t>(i / 4));  // consecutive, in order
    EXPECT_EQ(r.turn, static_cast<int64_t>(i % 4));
    ASSERT_EQ(r.messages.size(), static_cast<size_t>(2 * r.turn + 1));
    for (size_t m = 0; m < r.messages.size(); ++m) {
      const std::string who = std::to_string(m / 2) + " of " + std::to_string(r.session);
      EXPECT_EQ(r.messages[m].role, m % 2 == 0 ? "user" : "assistant");
      EXPECT_EQ(r.messages[m].content.rfind(m % 2 == 0 ? "question " + who : "answer " + who, 0), 0u) << m;
    }
    EXPECT_EQ(r.prompt, apply_chat_template(chatml(), r.messages, true));
    EXPECT_EQ(r.prompt_len, static_cast<int64_t>(ids(r.prompt).size()));
    // max_tokens: the file's reply to this turn, counted as vLLM counts it (special tokens added).
    const std::string reply = "answer " + std::to_string(r.turn) + " of " + std::to_string(r.session) + " is fine";
    EXPECT_EQ(r.output_len, static_cast<int64_t>(chatml().encode(reply, true, false).size()));
    // A later turn's tokens extend the previous turn's: the prefix a cache can reuse.
    if (r.turn > 0) {
      const std::vector<int32_t> prev = ids(w.requests[i - 1].prompt);
      EXPECT_EQ(common_prefix(prev, ids(r.prompt)), prev.size());
    }
  }
}

TEST(ShareGptSessions, MaxTurnsCapsEachSession) {
  DatasetOptions o = sharegpt_sessions(testing::temp_file("mt_cap.json", conversations_file(3, 4, 3)));
  o.multi_turn_max_turns = 2;
  const Workload w = load_workload(o, chatml());
  ASSERT_EQ(w.requests.size(), 6u);
  for (const SampleRequest& r : w.requests) EXPECT_LT(r.turn, 2);
}

TEST(ShareGptSessions, LongTurnsEndTheirSessionAndAreCounted) {
  DatasetOptions o = sharegpt_sessions(testing::temp_file("mt_long.json", conversations_file(3, 6, 40)));
  const Workload all = [&] {
    DatasetOptions big = o;
    big.sharegpt_max_prompt_len = big.sharegpt_max_total_len = 1 << 20;
    return load_workload(big, chatml());
  }();
  ASSERT_EQ(all.requests.size(), 18u);
  // A limit between turn 2's and turn 3's prompt length keeps turns 0..2 of every session.
  o.sharegpt_max_prompt_len = (all.requests[2].prompt_len + all.requests[3].prompt_len) / 2;
  const Workload w = load_workload(o, chatml());
  EXPECT_EQ(w.requests.size(), 9u);
  for (const SampleRequest& r : w.requests) EXPECT_LE(r.prompt_len, o.sharegpt_max_prompt_len);
  EXPECT_EQ(w.info["sessions_cut_at_length_limit"].get<int64_t>(), 3);
  EXPECT_EQ(w.info["turns_cut_at_length_limit"].get<int64_t>(), 9);
}

TEST(ShareGptSessions, NeedAChatTemplateAndAKnownHistoryMode) {
  const DatasetOptions o = sharegpt_sessions(testing::temp_file("mt_err.json", conversations_file(1, 2, 1)));
  GgufFile gguf(testing::stories_path());
  const auto stories = Tokenizer::from_gguf(gguf);
  try {
    load_workload(o, *stories);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("chat template"), std::string::npos) << e.what();
  }
  DatasetOptions bad = o;
  bad.multi_turn_history = "client";
  EXPECT_THROW(load_workload(bad, chatml()), Error);
  DatasetOptions trace = o;
  trace.name = "prefix";
  trace.path.clear();
  EXPECT_THROW(load_workload(trace, chatml()), Error);
  DatasetOptions stray;
  stray.multi_turn_turns = 7;  // without multi_turn
  EXPECT_THROW(load_workload(stray, chatml()), Error);
}

TEST(ShareGptSessions, ServerHistoryRendersWithReplacedReplies) {
  DatasetOptions o = sharegpt_sessions(testing::temp_file("mt_server.json", conversations_file(1, 2, 1)));
  o.multi_turn_history = "server";
  const Workload w = load_workload(o, chatml());
  ASSERT_TRUE(w.render);
  SampleRequest r = w.requests[1];
  r.messages[1].content = "a reply the server gave";
  w.render(r);
  EXPECT_NE(r.prompt.find("a reply the server gave"), std::string::npos);
  EXPECT_EQ(r.prompt_len, static_cast<int64_t>(ids(r.prompt).size()));
}

DatasetOptions random_sessions() {
  DatasetOptions o;
  o.name = "random";
  o.multi_turn = true;
  o.num_prompts = 4;
  o.multi_turn_turns = 3;
  o.random_input_len = 24;
  o.random_output_len = 10;
  o.random_range_ratio = 0.5;
  o.random_prefix_len = 40;     // shared by every session (vLLM's common_prefix_num_tokens)
  o.multi_turn_prefix_len = 30;  // each session's own (vLLM's prefix_num_tokens)
  o.seed = 3;
  return o;
}

TEST(RandomSessions, SeededTurnsWithPerTurnLengths) {
  const Workload a = load_workload(random_sessions(), chatml());
  const Workload b = load_workload(random_sessions(), chatml());
  ASSERT_EQ(a.requests.size(), 12u);
  std::set<int64_t> outputs;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].prompt, b.requests[i].prompt);
    EXPECT_EQ(a.requests[i].session, static_cast<int64_t>(i / 3));
    EXPECT_EQ(a.requests[i].turn, static_cast<int64_t>(i % 3));
    EXPECT_GE(a.requests[i].output_len, 5);
    EXPECT_LE(a.requests[i].output_len, 15);
    outputs.insert(a.requests[i].output_len);
    // Each user message after the first is token-stable at its drawn length, in [12, 36].
    const std::string& user = a.requests[i].messages.back().content;
    if (a.requests[i].turn > 0) {
      const size_t n = chatml().encode(user, false, false).size();
      EXPECT_GE(n, 12u);
      EXPECT_LE(n, 36u);
    }
  }
  EXPECT_GT(outputs.size(), 1u);  // drawn per turn
  DatasetOptions other = random_sessions();
  other.seed = 4;
  EXPECT_NE(load_workload(other, chatml()).requests[0].prompt, a.requests[0].prompt);
}

// Agent-shaped sessions: every session starts with the same system prompt (instructions, tool schema), its first user
// message is the task, and each later turn appends the reply and a short tool result; histories grow by both.
TEST(RandomSessions, AgentShapedSessionsShareASystemPromptAndAppendToolResults) {
  DatasetOptions o = random_sessions();
  o.multi_turn_turns = 12;
  o.random_range_ratio = 0.0;
  o.random_prefix_len = 0;
  o.multi_turn_prefix_len = 0;
  o.multi_turn_system_len = 200;
  o.multi_turn_tool_result_len = 7;
  const Workload w = load_workload(o, chatml());
  ASSERT_EQ(w.requests.size(), 48u);
  EXPECT_TRUE(w.sessions);
  EXPECT_EQ(w.info.at("system_len"), 200);
  EXPECT_EQ(w.info.at("tool_result_len"), 7);
  const std::string& system = w.requests[0].messages.front().content;
  for (const SampleRequest& r : w.requests) {
    ASSERT_EQ(r.messages.front().role, "system");
    EXPECT_EQ(r.messages.front().content, system);  // shared by every session
    EXPECT_EQ(r.messages.size(), static_cast<size_t>(2 + 2 * r.turn));  // system, task, (reply, result) per turn
    const size_t user = chatml().encode(r.messages.back().content, false, false).size();
    EXPECT_EQ(user, static_cast<size_t>(r.turn == 0 ? 24 : 7)) << "turn " << r.turn;
    if (r.turn > 0) {  // the turn re-sends the previous turn's prompt and appends a reply and a tool result
      const SampleRequest& before = w.requests[static_cast<size_t>(&r - w.requests.data()) - 1];
      EXPECT_GT(r.prompt_len, before.prompt_len + 7);
    }
  }
  EXPECT_EQ(chatml().encode(system, false, false).size(), 200u);
  o.multi_turn_tool_result_len = -1;
  EXPECT_THROW(load_workload(o, chatml()), Error);
  o.multi_turn_tool_result_len = 7;
  o.multi_turn = false;
  EXPECT_THROW(load_workload(o, chatml()), Error);  // needs --multi-turn
}

TEST(RandomSessions, SharedAndPerSessionPrefixesMeasuredOnTheTokens) {
  const DatasetOptions o = random_sessions();
  const Workload w = load_workload(o, chatml());
  const std::vector<int32_t> head = ids(apply_chat_template(chatml(), {{"user", ""}}, false));
  // Tokens before the user text: "<|im_start|>user\n" (the template has no system prompt).
  const size_t lead = common_prefix(head, ids(w.requests[0].prompt));
  ASSERT_GT(lead, 0u);
  for (int64_t s = 1; s < o.num_prompts; ++s) {
    const size_t shared = common_prefix(ids(w.requests[0].prompt), ids(w.requests[static_cast<size_t>(3 * s)].prompt));
    // The common prefix (40 tokens and its "\n") is shared; the per-session prefix that follows is not.
    EXPECT_GE(shared, lead + 40) << s;
    EXPECT_LT(shared, lead + 40 + 1 + 30) << s;
  }
  // Within a session each turn extends the last: its whole previous prompt is a reusable prefix.
  for (size_t i = 1; i < w.requests.size(); ++i) {
    if (w.requests[i].turn == 0) continue;
    const std::vector<int32_t> prev = ids(w.requests[i - 1].prompt);
    EXPECT_EQ(common_prefix(prev, ids(w.requests[i].prompt)), prev.size()) << i;
  }
}

// Length distributions (vLLM's names) in place of the fixed turns and range-ratio lengths: turns vary by session in
// the distribution's range, lengths follow theirs exactly on the tokens, and a constant draws nothing, so writing the
// plain options as constants gives the same workload.
TEST(RandomSessions, LengthDistributionsShapeTurnsAndTokens) {
  DatasetOptions o = random_sessions();
  o.num_prompts = 30;
  o.random_prefix_len = 0;
  o.multi_turn_turns_dist = "uniform:min=1,max=4";
  o.multi_turn_input_len_dist = "constant:value=9";
  o.multi_turn_output_len_dist = "poisson:alpha=6";
  o.multi_turn_prefix_len_dist = "uniform:min=0,max=20";
  const Workload w = load_workload(o, chatml());
  std::map<int64_t, int64_t> turns;  // session -> turns
  double outputs = 0;
  for (const SampleRequest& r : w.requests) {
    turns[r.session] = r.turn + 1;
    outputs += static_cast<double>(r.output_len);
    EXPECT_GE(r.output_len, 1);
    if (r.turn > 0) {
      EXPECT_EQ(chatml().encode(r.messages.back().content, false, false).size(), 9u);
    }
  }
  std::set<int64_t> distinct;
  for (const auto& [session, n] : turns) {
    EXPECT_GE(n, 1);
    EXPECT_LE(n, 4);
    distinct.insert(n);
  }
  EXPECT_EQ(turns.size(), 30u);
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_NEAR(outputs / static_cast<double>(w.requests.size()), 6.0, 1.5);  // ~75 draws of variance 6
  EXPECT_EQ(w.info.at("turns_dist"), "uniform:min=1,max=4");
  EXPECT_EQ(w.info.at("output_len_dist"), "poisson:alpha=6");
  EXPECT_EQ(load_workload(o, chatml()).requests.back().prompt, w.requests.back().prompt);  // seeded

  DatasetOptions plain = random_sessions(), as_dists = random_sessions();
  as_dists.multi_turn_turns_dist = "3";
  as_dists.multi_turn_prefix_len_dist = "constant:value=30";
  const Workload a = load_workload(plain, chatml()), b = load_workload(as_dists, chatml());
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) EXPECT_EQ(a.requests[i].prompt, b.requests[i].prompt) << i;

  o.multi_turn_turns_dist = "zipf:alpha=0.5";
  try {
    load_workload(o, chatml());
    ADD_FAILURE() << "zipf alpha 0.5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--multi-turn-turns-dist"), std::string::npos) << e.what();
  }
  DatasetOptions sharegpt = sharegpt_sessions(testing::temp_file("mt_dist.json", conversations_file(2, 2, 1)));
  sharegpt.multi_turn_input_len_dist = "constant:value=5";
  EXPECT_THROW(load_workload(sharegpt, chatml()), Error);
}

TEST(RandomSessions, BadOptionsNameTheirFlag) {
  const auto message = [](DatasetOptions o) {
    try {
      load_workload(o, chatml());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  DatasetOptions o = random_sessions();
  o.multi_turn_turns = 0;
  EXPECT_NE(message(o).find("--multi-turn-turns"), std::string::npos);
  o = random_sessions();
  o.multi_turn_prefix_len = -1;
  EXPECT_NE(message(o).find("--multi-turn-prefix-len"), std::string::npos);
  o = random_sessions();
  o.multi_turn_max_turns = 2;
  EXPECT_NE(message(o).find("--multi-turn-max-turns"), std::string::npos);
}

}  // namespace
}  // namespace servetune::datasets
