// Teacher-forced prompt logits (Request::prompt_logits): every prompt position's row equals the first-token logits of
// a request whose prompt ends at that position, through chunked prefill, a cached prefix (not reused), batching with
// other requests, tensor parallelism and a preemption; one row per position, never returned twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "servetune/engine.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

EngineConfig config_for(const std::string& model) {
  EngineConfig c;
  c.model = model;
  c.threads = 2;
  c.max_total_tokens = 4096;
  c.chunked_prefill_size = 16;  // a 40-token prompt runs in three chunks
  c.max_prefill_tokens = 64;
  return c;
}

struct Scored {
  std::vector<float> rows;  // [positions, vocab]
  std::vector<int32_t> output;
  int events_without_tokens = 0;
};

Scored score(Engine& engine, const std::vector<int32_t>& prompt, int max_tokens = 1) {
  Request r;
  r.prompt_ids = prompt;
  r.prompt_logits = true;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  auto stream = engine.submit(r);
  Scored out;
  while (auto e = stream->next()) {
    out.rows.insert(out.rows.end(), e->prompt_logits.begin(), e->prompt_logits.end());
    out.output.insert(out.output.end(), e->token_ids.begin(), e->token_ids.end());
    if (e->token_ids.empty() && !e->prompt_logits.empty()) ++out.events_without_tokens;
    if (e->finish != FinishReason::kNone) {
      EXPECT_NE(e->finish, FinishReason::kError) << e->error;
      break;
    }
  }
  return out;
}

// The first output token's logprobs (top 5) of the prompt `prefix`: what row prefix.size() - 1 must give.
SampleResult first_token(Engine& engine, const std::vector<int32_t>& prefix) {
  Request r;
  r.prompt_ids = prefix;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 1;
  r.sampling.logprobs = 5;
  r.sampling.ignore_eos = true;
  auto stream = engine.submit(r);
  SampleResult out;
  while (auto e = stream->next()) {
    if (!e->logprobs.empty()) out = e->logprobs[0];
    if (e->finish != FinishReason::kNone) break;
  }
  return out;
}

// Row `row` of `rows` as log-probabilities.
std::vector<double> log_softmax(const std::vector<float>& rows, size_t row, size_t vocab) {
  const float* l = rows.data() + row * vocab;
  const double top = *std::max_element(l, l + vocab);
  double sum = 0.0;
  for (size_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(l[v]) - top);
  std::vector<double> out(vocab);
  for (size_t v = 0; v < vocab; ++v) out[v] = static_cast<double>(l[v]) - top - std::log(sum);
  return out;
}

void expect_rows_match_prefixes(const EngineConfig& config, const std::string& name) {
  Engine engine(config);
  const auto vocab = static_cast<size_t>(engine.model_info().vocab);
  std::vector<int32_t> prompt = engine.tokenizer().encode("Once upon a time, there was a little girl named Lily who loved to play outside", true);
  while (prompt.size() < 40) prompt.push_back(prompt[prompt.size() % 7 + 1]);
  // A first request caches the prompt's blocks: the scored one must not take them (its rows would be missing).
  score(engine, prompt);
  const Scored s = score(engine, prompt, 3);
  ASSERT_EQ(s.rows.size(), (prompt.size() - 1) * vocab) << name;
  EXPECT_GE(s.events_without_tokens, 2) << name << ": the earlier chunks' rows come before any token";
  for (size_t p = 0; p + 1 < prompt.size(); p += 3) {
    const std::vector<int32_t> prefix(prompt.begin(), prompt.begin() + static_cast<long>(p) + 1);
    const SampleResult want = first_token(engine, prefix);
    const auto got = log_softmax(s.rows, p, vocab);
    ASSERT_FALSE(want.top.empty());
    EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(), want.top[0].token) << name << " position " << p;
    for (const TokenLogprob& t : want.top) {
      EXPECT_NEAR(got[static_cast<size_t>(t.token)], t.logprob, 1e-4) << name << " position " << p << " token " << t.token;
    }
  }
  // The last prompt position is the sampling row, not a prompt row: its greedy token is the output's first.
  EXPECT_EQ(s.output.size(), 3u);
  EXPECT_EQ(s.output[0], first_token(engine, prompt).top[0].token);
}

TEST(EnginePromptLogits, RowsEqualEachPrefixsNextTokenLogits) {
  expect_rows_match_prefixes(config_for(testing::stories_path()), "stories260K");
  EngineConfig tp = config_for(testing::stories_path());
  tp.tp_size = 2;
  expect_rows_match_prefixes(tp, "stories260K tp 2");
  expect_rows_match_prefixes(config_for(testing::smollm2_path()), "SmolLM2");
}

// Many scored prompts at once in a cache too small for all of them: some are preempted and recomputed, and still
// every prompt gets each position's row once, equal to the row it gets alone.
TEST(EnginePromptLogits, PreemptedAndBatchedPromptsReturnEachRowOnce) {
  EngineConfig c = config_for(testing::stories_path());
  c.max_total_tokens = 256;  // 16 pages of 16: four 60-token requests with 30 output tokens do not all fit
  c.page_size = 16;
  Engine engine(c);
  const auto vocab = static_cast<size_t>(engine.model_info().vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = {1};
    for (int k = 0; k < 59; ++k) p.push_back(3 + (i * 31 + k * 7) % 250);
    prompts.push_back(p);
  }
  std::vector<Scored> alone;
  for (const auto& p : prompts) alone.push_back(score(engine, p, 30));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    Request r;
    r.prompt_ids = p;
    r.prompt_logits = true;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 30;
    r.sampling.ignore_eos = true;
    streams.push_back(engine.submit(r));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    std::vector<float> rows;
    while (auto e = streams[i]->next()) {
      rows.insert(rows.end(), e->prompt_logits.begin(), e->prompt_logits.end());
      if (e->finish != FinishReason::kNone) break;
    }
    ASSERT_EQ(rows.size(), (prompts[i].size() - 1) * vocab) << "request " << i;
    EXPECT_EQ(rows, alone[i].rows) << "request " << i;
  }
  EXPECT_GT(engine.stats().preemptions, 0) << "the cache was meant to be too small for all four at once";
}

}  // namespace
}  // namespace servetune
