// Perplexity and KL divergence over a ChunkScorer: the built-in engine's here, a server's in perplexity_server.cpp
// (see perplexity.h); the log-probability file is logprob_file.h.
#include "loadgen/perplexity.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <memory>
#include <sstream>

#include "datasets/dataset.h"
#include "loadgen/logprob_file.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::loadgen {
namespace {

// The built-in engine's teacher-forced logits rows (Request::prompt_logits), as whole log-probability rows.
class EngineScorer : public ChunkScorer {
 public:
  explicit EngineScorer(Engine& engine) : engine_(engine), vocab_(engine.model_info().vocab) {}
  bool dense() const override { return true; }
  int32_t vocab() const override { return static_cast<int32_t>(vocab_); }

  void submit(const std::vector<int32_t>& chunk) override {
    Request r;
    r.prompt_ids = chunk;
    r.prompt_logits = true;
    r.detokenize = false;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 1;
    r.sampling.ignore_eos = true;
    in_flight_.push_back({chunk, engine_.submit(std::move(r))});
  }

  void score_next(const std::function<void(const PositionLogprobs&)>& sink) override {
    const auto [chunk, stream] = std::move(in_flight_.front());
    in_flight_.pop_front();
    const std::vector<float> rows = collect_rows(*stream);
    const size_t ctx = chunk.size(), vocab = static_cast<size_t>(vocab_);
    if (rows.size() != (ctx - 1) * vocab) {
      throw Error(ErrorKind::kInternal, "perplexity: chunk " + std::to_string(scored_) + " returned " + std::to_string(rows.size() / vocab) +
                                            " logits rows, expected " + std::to_string(ctx - 1));
    }
    ++scored_;
    PositionLogprobs pos;
    pos.dense.resize(vocab);
    for (size_t p = ctx / 2; p + 1 < ctx; ++p) {
      log_softmax(std::span<const float>(rows.data() + p * vocab, vocab), lp_);
      pos.target = chunk[p + 1];
      pos.target_logprob = lp_[static_cast<size_t>(pos.target)];
      for (size_t t = 0; t < vocab; ++t) pos.dense[t] = static_cast<float>(lp_[t]);
      sink(pos);
    }
  }

 private:
  static std::vector<float> collect_rows(RequestStream& stream) {
    std::vector<float> rows;
    while (auto e = stream.next()) {
      rows.insert(rows.end(), e->prompt_logits.begin(), e->prompt_logits.end());
      if (e->finish == FinishReason::kError || e->finish == FinishReason::kAbort) {
        throw Error(ErrorKind::kInternal, "perplexity: a chunk's request ended with " + std::string(finish_reason_name(e->finish)) +
                                              (e->error.empty() ? "" : ": " + e->error));
      }
      if (e->finish != FinishReason::kNone) break;
    }
    return rows;
  }

  Engine& engine_;
  int64_t vocab_;
  std::deque<std::pair<std::vector<int32_t>, std::shared_ptr<RequestStream>>> in_flight_;
  size_t scored_ = 0;
  std::vector<double> lp_;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(at));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

}  // namespace

std::string perplexity_text(const std::string& dataset, int64_t num_texts, uint64_t seed, const Tokenizer& tokenizer) {
  if (dataset != "sharegpt" && !dataset.ends_with(".json")) {
    std::ifstream in(dataset, std::ios::binary);
    if (!in) throw_io(dataset, "cannot open the text file");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  datasets::DatasetOptions d;
  d.name = "sharegpt";
  if (dataset != "sharegpt") d.path = dataset;
  d.num_prompts = num_texts;
  d.seed = seed;
  d.no_oversample = true;
  std::string text;
  for (const auto& r : datasets::sample_sharegpt(d, tokenizer).requests) text += (text.empty() ? "" : "\n\n") + r.prompt;
  return text;
}

std::vector<std::vector<int32_t>> perplexity_chunks(const std::vector<int32_t>& tokens, int ctx, int chunks, int32_t bos) {
  if (ctx < 4) throw_usage("--ctx must be at least 4, got " + std::to_string(ctx));
  if (tokens.size() < 2 * static_cast<size_t>(ctx)) {
    throw_usage("perplexity with a context of " + std::to_string(ctx) + " needs at least " + std::to_string(2 * ctx) +
                " tokens of text; this text has " + std::to_string(tokens.size()));
  }
  auto n = static_cast<int>(tokens.size() / static_cast<size_t>(ctx));
  if (chunks >= 0) n = std::min(n, chunks);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    const auto start = tokens.begin() + static_cast<long>(i) * ctx;
    std::vector<int32_t> chunk(start, start + ctx);
    if (bos >= 0) chunk[0] = bos;
    out.push_back(std::move(chunk));
  }
  return out;
}

PerplexityResult measure_perplexity(ChunkScorer& scorer, const std::vector<std::vector<int32_t>>& chunks, const PerplexityOptions& o) {
  const int first = o.ctx / 2;
  const LogprobShape shape{o.ctx, scorer.vocab(), chunks};
  std::optional<LogprobWriter> save;
  if (!o.save_logprobs.empty()) save.emplace(o.save_logprobs, shape, scorer.dense());
  std::optional<LogprobReader> base;
  if (!o.kl_base.empty()) base.emplace(o.kl_base, shape, scorer.dense());

  PerplexityResult result;
  result.ctx = o.ctx;
  result.chunks = static_cast<int>(chunks.size());
  double nll = 0.0, nll2 = 0.0, base_nll = 0.0;
  std::vector<double> kls;
  int64_t agree = 0;
  bool top_k = !scorer.dense();
  size_t next = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    while (next < chunks.size() && next - i < static_cast<size_t>(std::max(1, o.in_flight))) scorer.submit(chunks[next++]);
    int p = first;
    scorer.score_next([&](const PositionLogprobs& pos) {
      if (p >= o.ctx - 1 || pos.target != chunks[i][static_cast<size_t>(p) + 1]) {
        throw Error(ErrorKind::kInternal, "perplexity: chunk " + std::to_string(i) + " scored other positions than " +
                                              std::to_string(first) + ".." + std::to_string(o.ctx - 2));
      }
      ++p;
      const double v = -pos.target_logprob;
      nll += v;
      nll2 += v * v;
      ++result.scored;
      if (save) save->write(pos);
      if (base) {
        const PositionLogprobs b = base->next(pos.target);
        top_k = top_k || !b.is_dense();
        kls.push_back(kl_divergence(b, pos));
        base_nll -= b.target_logprob;
        agree += pos.top_token() == b.top_token() ? 1 : 0;
      }
    });
    if (p != o.ctx - 1) {
      throw Error(ErrorKind::kInternal, "perplexity: chunk " + std::to_string(i) + " scored " + std::to_string(p - first) +
                                            " positions, expected " + std::to_string(o.ctx - 1 - first));
    }
    result.running_ppl.push_back(std::exp(nll / static_cast<double>(result.scored)));
  }
  if (save) save->finish();
  const auto count = static_cast<double>(result.scored);
  const double mean = nll / count;
  result.ppl = std::exp(mean);
  const double variance = nll2 / count - mean * mean;
  result.ppl_error = variance > 0 ? std::sqrt(variance / (count - 1)) * result.ppl : 0.0;
  if (base) {
    KlStats k;
    double sum = 0.0;
    for (double v : kls) sum += v;
    k.mean = sum / count;
    k.median = percentile(kls, 0.5);
    k.p99 = percentile(kls, 0.99);
    k.max = kls.empty() ? 0.0 : *std::max_element(kls.begin(), kls.end());
    k.top_k = top_k;
    k.top1_agreement = static_cast<double>(agree) / count;
    k.base_ppl = std::exp(base_nll / count);
    k.delta_ppl = result.ppl - k.base_ppl;
    result.kl = k;
  }
  return result;
}

PerplexityResult measure_perplexity(Engine& engine, const std::vector<int32_t>& tokens, const PerplexityOptions& o) {
  const Tokenizer& tok = engine.tokenizer();
  const auto chunks = perplexity_chunks(tokens, o.ctx, o.chunks, tok.add_bos() ? tok.bos_id() : -1);
  EngineScorer scorer(engine);
  return measure_perplexity(scorer, chunks, o);
}

}  // namespace servetune::loadgen
