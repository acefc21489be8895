// Teacher-forced perplexity, windowed as llama.cpp's llama-perplexity does, and KL divergence against a saved
// baseline run (the accuracy side of tuning: KV dtype, weight formats, kernels), over the built-in engine (whole
// logits rows) or an OpenAI-compatible server's prompt_logprobs (perplexity_server.h; top-K rows, whose KL is defined
// in position_logprobs.h).
//
// Windowing (llama-perplexity's): the text is tokenized once (BOS as the model wants); it splits into
// floor(tokens / ctx) chunks of ctx tokens (at most `chunks`), the first token of each replaced by BOS when the model
// adds one; each chunk is one prompt, and only its second half is scored: the logits at positions ctx/2 .. ctx-2
// predict tokens ctx/2+1 .. ctx-1 (the model always has at least ctx/2 tokens of context). PPL = exp(mean NLL) with
// llama.cpp's uncertainty (the NLL's standard error, times PPL).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/position_logprobs.h"

namespace servetune {
class Engine;
class Tokenizer;
}

namespace servetune::loadgen {

struct PerplexityOptions {
  int ctx = 512;
  int chunks = -1;          // at most this many chunks (-1: all)
  int in_flight = 2;        // chunks submitted at once (engine: each returns ctx x vocab logits; server: requests)
  std::string save_logprobs;  // write the scored positions' log-probabilities here (the baseline for kl_base)
  std::string kl_base;        // compare against a file save_logprobs wrote for the same tokens and ctx
};

struct KlStats {
  double mean = 0.0, median = 0.0, p99 = 0.0, max = 0.0;  // KL(base || this run) per scored position, in nats
  bool top_k = false;  // a side held top-K rows: the KL is the lower bound position_logprobs.h defines
  double top1_agreement = 0.0;  // fraction of positions whose most likely token is the base's
  double base_ppl = 0.0;
  double delta_ppl = 0.0;  // this run's PPL - the base's
};

struct PerplexityResult {
  int ctx = 0;
  int chunks = 0;
  int64_t scored = 0;  // tokens scored
  double ppl = 0.0;
  double ppl_error = 0.0;           // llama-perplexity's "+/-"
  std::vector<double> running_ppl;  // after each chunk, as llama-perplexity prints [1]x,[2]y,...
  std::optional<KlStats> kl;
};

// The text to score: a plain text file, or "sharegpt" / a ShareGPT .json: the first human turns of `num_texts`
// conversations (sampled by `seed` as bench samples them) joined by blank lines. Throws Error(kIo) for a file it
// cannot read.
std::string perplexity_text(const std::string& dataset, int64_t num_texts, uint64_t seed, const Tokenizer& tokenizer);

// Splits `tokens` into the chunks the windowing above evaluates (bos < 0: no replacement). Throws Error(kUsage) when
// there are fewer than 2 x ctx tokens (as llama-perplexity requires) or ctx < 4.
std::vector<std::vector<int32_t>> perplexity_chunks(const std::vector<int32_t>& tokens, int ctx, int chunks, int32_t bos);

// What computes the chunks' log-probabilities: submit() sends a chunk (up to PerplexityOptions::in_flight ahead of
// the one being scored), score_next() hands the oldest submitted chunk's scored positions (ctx/2 .. ctx-2, in order)
// to `sink`.
class ChunkScorer {
 public:
  virtual ~ChunkScorer() = default;
  virtual bool dense() const = 0;     // whole rows (the engine), or top-K (a server)
  virtual int32_t vocab() const = 0;  // the rows' size (dense), or the tokenizer's vocabulary
  virtual void submit(const std::vector<int32_t>& chunk) = 0;
  virtual void score_next(const std::function<void(const PositionLogprobs&)>& sink) = 0;
};

// Scores `chunks` (perplexity_chunks) with `scorer`; with options.kl_base the base file must hold the same chunk
// tokens (else Error(kUsage) naming it). Throws Error(kIo) for files it cannot read or write.
PerplexityResult measure_perplexity(ChunkScorer& scorer, const std::vector<std::vector<int32_t>>& chunks,
                                    const PerplexityOptions& options);

// The text's chunks run on `engine` (Request::prompt_logits), as above.
PerplexityResult measure_perplexity(Engine& engine, const std::vector<int32_t>& tokens, const PerplexityOptions& options);

}  // namespace servetune::loadgen
