// Checks shared by the speculative-decoding integration tests: greedy outputs identical with and without speculation
// (concurrency 1 and 32, chunked prefill, prefix caching, a KV cache small enough to preempt), and sampled
// per-position token distributions unchanged (two-sample chi-square). Test-only; included by one file per executable.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "chi_square.h"
#include "servetune/engine.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

const std::string kMtpModel = "hf_models/deepseek_v3_mtp_tiny";  // DeepSeek-V3 tiny with a trained MTP layer
const std::string kStoriesHead = "eagle/stories260K_head";        // a random EAGLE head for stories260K

struct Job {
  std::vector<int32_t> prompt;
  int max_tokens;
  std::vector<std::string> stop;
};

struct Result {
  std::vector<int32_t> ids;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  bool operator==(const Result&) const = default;
};

struct RunStats {
  int64_t events = 0, tokens = 0, bursts = 0;
};

// Runs the jobs `concurrency` at a time (greedy).
std::vector<Result> run(Engine& engine, const std::vector<Job>& jobs, size_t concurrency, RunStats& rs) {
  std::vector<Result> results(jobs.size());
  for (size_t begin = 0; begin < jobs.size(); begin += concurrency) {
    const size_t end = std::min(jobs.size(), begin + concurrency);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = begin; i < end; ++i) {
      Request r;
      r.prompt_ids = jobs[i].prompt;
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = jobs[i].max_tokens;
      r.sampling.stop = jobs[i].stop;
      streams.push_back(engine.submit(r));
    }
    for (size_t i = begin; i < end; ++i) {
      Result& res = results[i];
      EngineClock::time_point last{};
      while (auto e = streams[i - begin]->next()) {
        EXPECT_GE(e->time, last);
        last = e->time;
        ++rs.events;
        rs.tokens += static_cast<int64_t>(e->token_ids.size());
        if (e->token_ids.size() > 1) ++rs.bursts;
        EXPECT_EQ(e->usage.completion_tokens, static_cast<int64_t>(res.ids.size() + e->token_ids.size()));
        res.ids.insert(res.ids.end(), e->token_ids.begin(), e->token_ids.end());
        res.text += e->text;
        if (e->finish != FinishReason::kNone) {
          EXPECT_NE(e->finish, FinishReason::kError) << e->error;
          res.finish = e->finish;
          break;
        }
      }
      EXPECT_LE(static_cast<int>(res.ids.size()), jobs[i].max_tokens);
    }
  }
  return results;
}

// How a test speculates: no algorithm, ngram, draft with a draft model, or mtp (the model's own next-n layer).
struct Spec {
  std::string algorithm;
  std::string draft_model;
  double min_acceptance = 0.0;  // asserted acceptance rate (draft model = target: near 1; < 0: a random head, none)
  int num_steps = 4;            // draft / mtp
  int disable_by_batch_size = 0;
  int topk = 0;                 // eagle / mtp: > 1 drafts a tree of num_draft_tokens nodes (the root included)
  int num_draft_tokens = 0;
  std::string token_map;        // eagle / mtp: a draft vocabulary file (speculative_token_map)
  bool q8_0 = false;            // eagle / mtp: speculative_draft_model_quantization q8_0
  int tp_size = 1;              // tensor-parallel ranks (threads of this process)
};
const Spec kNoSpec{};
const Spec kNgram{"ngram", "", 0.0};

EngineConfig config(const std::string& model, const Spec& spec) {
  EngineConfig c;
  c.model = model;
  c.threads = 2;
  c.max_total_tokens = 32768;
  c.chunked_prefill_size = 64;  // chunked prefill and prefix caching (on by default) both in play
  c.max_prefill_tokens = 256;
  c.tp_size = spec.tp_size;
  c.speculative_algorithm = parse_speculative_algorithm(spec.algorithm);
  c.speculative_disable_by_batch_size = spec.disable_by_batch_size;
  if (spec.algorithm == "ngram") {
    c.speculative_num_draft_tokens = 4;
    c.speculative_ngram_max_match_window_size = 4;
  } else if (spec.algorithm == "draft") {
    c.speculative_draft_model = spec.draft_model;
    c.speculative_num_steps = spec.num_steps;
  } else if (!spec.algorithm.empty()) {
    c.speculative_num_steps = spec.num_steps;
    c.speculative_draft_model = spec.draft_model;  // EAGLE's head, or none (MTP)
    c.speculative_eagle_topk = spec.topk;
    c.speculative_num_draft_tokens = spec.num_draft_tokens;
    c.speculative_token_map = spec.token_map;
    if (spec.q8_0) c.speculative_draft_model_quantization = DraftModelQuantization::kQ8_0;
  }
  return c;
}

std::vector<Job> jobs_for(const Tokenizer& tok, const std::vector<std::string>& texts, int n, int max_tokens) {
  std::vector<Job> jobs;
  for (int i = 0; i < n; ++i) {
    std::string text = texts[static_cast<size_t>(i) % texts.size()];
    if (i % 3 == 1) text += " " + text;  // repeated text: the n-gram lookup has something to find
    Job j{tok.encode(text), 1 + (i * 13) % max_tokens, {}};
    if (i % 5 == 2) j.stop = {"the"};  // stop strings apply inside accepted bursts too
    jobs.push_back(j);
  }
  return jobs;
}

void check_model(const std::string& model, const std::vector<std::string>& texts, int n, int max_tokens, const Spec& spec) {
  SERVETUNE_REQUIRE_FILE(model);
  std::vector<Job> jobs;
  std::vector<Result> reference;
  {
    Spec none = kNoSpec;
    none.tp_size = spec.tp_size;  // the same ranks' arithmetic without speculation
    Engine engine(config(model, none));
    jobs = jobs_for(engine.tokenizer(), texts, n, max_tokens);
    RunStats rs;
    reference = run(engine, jobs, 1, rs);
  }
  {
    // A KV cache small enough to preempt sequences that carry drafts: still identical, nothing leaks.
    EngineConfig tiny = config(model, spec);
    tiny.max_total_tokens = 512;
    tiny.page_size = 8;
    Engine engine(tiny);
    RunStats rs;
    const auto outs = run(engine, jobs, 32, rs);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i].ids, reference[i].ids) << "tiny KV cache, request " << i;
    EXPECT_GT(engine.stats().preemptions, 0);
    EXPECT_EQ(engine.stats().kv_blocks_used, 0);
    EXPECT_EQ(engine.stats().spec_draft_kv_blocks_used, 0);
  }
  Engine engine(config(model, spec));
  for (size_t concurrency : {size_t{1}, size_t{32}}) {
    RunStats rs;
    const auto outs = run(engine, jobs, concurrency, rs);
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(outs[i].ids, reference[i].ids) << "concurrency " << concurrency << ", request " << i;
      EXPECT_EQ(outs[i].text, reference[i].text) << "concurrency " << concurrency << ", request " << i;
      EXPECT_EQ(outs[i].finish, reference[i].finish) << "concurrency " << concurrency << ", request " << i;
    }
    if (spec.min_acceptance >= 0) {
      EXPECT_GT(rs.bursts, 0) << "accepted drafts arrive as multi-token events";
    }
  }
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.spec_draft_kv_blocks_used, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_GT(s.spec_num_drafts, 0);
  EXPECT_LE(s.spec_accepted_tokens, s.spec_draft_tokens);
  if (spec.min_acceptance >= 0) {
    EXPECT_GE(s.spec_acceptance_rate(), spec.min_acceptance);
    EXPECT_GT(s.spec_accepted_tokens, 0);
    EXPECT_GT(s.spec_acceptance_rate(), 0.0);
    EXPECT_GT(s.spec_mean_accepted_length(), 1.0);
  }
  ASSERT_FALSE(s.spec_accepted_per_position.empty());
  EXPECT_LE(s.spec_accepted_per_position[0], s.spec_num_drafts);
  EXPECT_GT(s.prefix_cache_hit_rate(), 0.0);
  if (spec.disable_by_batch_size > 0) {
    EXPECT_GT(s.spec_disabled_steps, 0);
  }
  EXPECT_GT(s.spec_draft_seconds, 0.0);
  std::printf("%s, %s: %lld drafts, %lld draft tokens, %lld accepted (%.1f%%), mean accepted length %.2f\n", model.c_str(),
              spec.algorithm.c_str(), static_cast<long long>(s.spec_num_drafts), static_cast<long long>(s.spec_draft_tokens),
              static_cast<long long>(s.spec_accepted_tokens), 100.0 * s.spec_acceptance_rate(), s.spec_mean_accepted_length());
}

const std::vector<std::string> kStoriesTexts = {
    "Once upon a time, there was a little girl named Lily. She liked to play with her ball.",
    "Tom and Sue went to the park to play with a big red ball. They ran and laughed all day long.",
    "The cat sat on the mat. The dog sat on the mat. The bird sat on the",
    "One day, a bird flew into the garden and sang a song."};
const std::vector<std::string> kSmolTexts = {
    "Repeat this list three times: apple, banana, cherry, grape, lemon, mango.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
    "Summarise: The meeting is on Monday. The meeting is about the budget. The budget is tight."};

// Sampling with the engine: the per-position token distributions over many seeds match with and without ngram
// speculation (two-sample chi-square, sparse cells pooled, critical value at p = 1e-6 per position).
std::vector<std::vector<int32_t>> sample_many(const std::string& model, const Spec& spec, int n, int len) {
  const bool speculate = !spec.algorithm.empty();
  Engine engine(config(model, spec));
  const std::string text = "Lily had a red ball. Lily had a blue ball. Lily had a";
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt = text;
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 40;
    r.sampling.max_tokens = len;
    r.sampling.ignore_eos = true;
    r.sampling.seed = static_cast<uint64_t>(i) * 7919u + (speculate ? 1u : 2u);
    streams.push_back(engine.submit(r));
  }
  std::vector<std::vector<int32_t>> outs;
  for (auto& st : streams) {
    std::vector<int32_t> out;
    while (auto e = st->next()) {
      out.insert(out.end(), e->token_ids.begin(), e->token_ids.end());
      if (e->finish != FinishReason::kNone) break;
    }
    EXPECT_EQ(static_cast<int>(out.size()), len);
    outs.push_back(out);
  }
  if (speculate) {
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.spec_draft_kv_blocks_used, 0);
    EXPECT_GT(s.spec_accepted_tokens, 0);
    std::printf("sampling: acceptance %.1f%%, mean accepted length %.2f\n", 100.0 * s.spec_acceptance_rate(),
                s.spec_mean_accepted_length());
  }
  return outs;
}

void check_sampled_distribution(const Spec& speculation, const std::string& model = testing::stories_path()) {
  constexpr int kRuns = 3000, kLen = 6;
  const auto plain = sample_many(model, kNoSpec, kRuns, kLen);
  const auto spec = sample_many(model, speculation, kRuns, kLen);
  for (int pos = 1; pos < kLen; ++pos) {
    std::map<int32_t, std::pair<int64_t, int64_t>> cells;
    for (const auto& o : plain) ++cells[o[static_cast<size_t>(pos)]].first;
    for (const auto& o : spec) ++cells[o[static_cast<size_t>(pos)]].second;
    const auto [stat, critical, df] = testing::two_sample_chi_square(cells);
    ASSERT_GT(df, 0);
    EXPECT_LT(stat, critical) << "position " << pos << " (df " << df << ")";
    std::printf("position %d: chi-square %.1f, df %d, critical %.1f\n", pos, stat, df, critical);
  }
}

}  // namespace
}  // namespace servetune
