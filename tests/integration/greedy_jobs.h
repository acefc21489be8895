// Greedy request batches for the engine's integration tests: an engine config with chunked prefill, a mixed batch of
// stories-style prompts (some sharing a prefix), submitting them greedily, and collecting every request's tokens.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "servetune/engine.h"
#include "tokenizer/tokenizer.h"

namespace servetune::testing {

// An engine on `model` whose steps mix chunked prefills (16 tokens of a prompt, 48 in all) with decodes.
inline EngineConfig chunked_config(const std::string& model) {
  EngineConfig c;
  c.model = model;
  c.max_total_tokens = 16384;
  c.chunked_prefill_size = 16;  // long prompts take several steps
  c.max_prefill_tokens = 48;
  return c;
}

struct Job {
  std::vector<int32_t> prompt;
  int max_tokens;
};

// `count` prompts of 1-4 sentences, every third with a repeated sentence in front (a shared prefix); request i asks
// for 1 + (i * 11) % max_tokens_mod tokens.
inline std::vector<Job> mixed_jobs(const Tokenizer& tok, int count, int max_tokens_mod) {
  const std::vector<std::string> texts = {"Once upon a time, there was a little girl named Lily.", "The cat sat on the mat.",
                                          "Tom and Sue went to the park to play with a big red ball.", "Hi",
                                          "One day, a bird flew into the garden and sang a song."};
  std::vector<Job> jobs;
  for (int i = 0; i < count; ++i) {
    std::string text;
    for (int k = 0; k <= i % 4; ++k) text += texts[static_cast<size_t>((i + k) % texts.size())] + " ";
    if (i % 3 == 0) text = texts[2] + texts[2] + text;
    jobs.push_back({tok.encode(text), 1 + (i * 11) % max_tokens_mod});
  }
  return jobs;
}

// With ignore_eos every request runs to max_tokens, as token ids only.
inline std::shared_ptr<RequestStream> submit_greedy(Engine& engine, const Job& job, bool ignore_eos = false) {
  Request r;
  r.prompt_ids = job.prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = job.max_tokens;
  r.sampling.ignore_eos = ignore_eos;
  r.detokenize = !ignore_eos;
  return engine.submit(r);
}

// Collects a stream's tokens to its end; returns the finish reason (an error finish fails the test).
inline FinishReason drain(RequestStream& s, std::vector<int32_t>& out) {
  while (auto e = s.next()) {
    out.insert(out.end(), e->token_ids.begin(), e->token_ids.end());
    if (e->finish != FinishReason::kNone) {
      EXPECT_NE(e->finish, FinishReason::kError) << e->error;
      return e->finish;
    }
  }
  ADD_FAILURE() << "stream ended without a final event";
  return FinishReason::kError;
}

// Submits every job at once (one continuous batch) and returns each one's tokens.
inline std::vector<std::vector<int32_t>> run_greedy(Engine& engine, const std::vector<Job>& jobs, bool ignore_eos = false) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& job : jobs) streams.push_back(submit_greedy(engine, job, ignore_eos));
  std::vector<std::vector<int32_t>> outs(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const FinishReason finish = drain(*streams[i], outs[i]);
    if (ignore_eos) {
      EXPECT_EQ(finish, FinishReason::kLength) << "request " << i;
    }
  }
  return outs;
}

}  // namespace servetune::testing
