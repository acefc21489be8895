// Perplexity and KL divergence over the built-in engine (see perplexity.h). The log-probability file: "STLOGP01",
// int32 ctx, vocab, chunks, the chunks' tokens (chunks x ctx int32), then per chunk and scored position the
// vocabulary's log-probabilities (f32), in order.
#include "loadgen/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <sstream>

#include "datasets/dataset.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::loadgen {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'L', 'O', 'G', 'P', '0', '1'};

struct Header {
  int32_t ctx = 0, vocab = 0, chunks = 0;
};

// log-softmax of one logits row, in double.
void log_softmax(const float* logits, size_t vocab, std::vector<double>& out) {
  const double top = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (size_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
  const double norm = top + std::log(sum);
  out.resize(vocab);
  for (size_t v = 0; v < vocab; ++v) out[v] = static_cast<double>(logits[v]) - norm;
}

std::shared_ptr<RequestStream> submit_chunk(Engine& engine, const std::vector<int32_t>& chunk) {
  Request r;
  r.prompt_ids = chunk;
  r.prompt_logits = true;
  r.detokenize = false;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 1;
  r.sampling.ignore_eos = true;
  return engine.submit(std::move(r));
}

std::vector<float> collect_rows(RequestStream& stream) {
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

PerplexityResult measure_perplexity(Engine& engine, const std::vector<int32_t>& tokens, const PerplexityOptions& o) {
  const Tokenizer& tok = engine.tokenizer();
  const std::vector<std::vector<int32_t>> chunks = perplexity_chunks(tokens, o.ctx, o.chunks, tok.add_bos() ? tok.bos_id() : -1);
  const auto vocab = static_cast<size_t>(engine.model_info().vocab);
  const int first = o.ctx / 2;
  const Header header{o.ctx, static_cast<int32_t>(vocab), static_cast<int32_t>(chunks.size())};

  std::ofstream save;
  if (!o.save_logprobs.empty()) {
    save.open(o.save_logprobs, std::ios::binary);
    if (!save) throw_io(o.save_logprobs, "cannot write the log-probabilities");
    save.write(kMagic, sizeof(kMagic));
    save.write(reinterpret_cast<const char*>(&header), sizeof(header));
    for (const auto& c : chunks) save.write(reinterpret_cast<const char*>(c.data()), static_cast<std::streamsize>(c.size() * sizeof(int32_t)));
  }
  std::ifstream base;
  if (!o.kl_base.empty()) {
    base.open(o.kl_base, std::ios::binary);
    if (!base) throw_io(o.kl_base, "cannot open the base log-probabilities");
    char magic[8] = {};
    Header h;
    base.read(magic, sizeof(magic));
    base.read(reinterpret_cast<char*>(&h), sizeof(h));
    if (!base || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) throw_usage(o.kl_base + ": not a file servetune perplexity --save-logprobs wrote");
    if (h.ctx != header.ctx || h.vocab != header.vocab || h.chunks != header.chunks) {
      throw_usage(o.kl_base + ": the base ran ctx " + std::to_string(h.ctx) + ", vocabulary " + std::to_string(h.vocab) + ", " +
                  std::to_string(h.chunks) + " chunks; this run has " + std::to_string(header.ctx) + ", " + std::to_string(header.vocab) +
                  ", " + std::to_string(header.chunks) + " (same --ctx, --chunks, text and tokenizer needed)");
    }
    std::vector<int32_t> base_tokens(static_cast<size_t>(h.ctx));
    for (const auto& c : chunks) {
      base.read(reinterpret_cast<char*>(base_tokens.data()), static_cast<std::streamsize>(base_tokens.size() * sizeof(int32_t)));
      if (!base || base_tokens != c) throw_usage(o.kl_base + ": the base scored other tokens (same text and tokenizer needed)");
    }
  }

  PerplexityResult result;
  result.ctx = o.ctx;
  result.chunks = static_cast<int>(chunks.size());
  double nll = 0.0, nll2 = 0.0, base_nll = 0.0;
  std::vector<double> kls;
  int64_t agree = 0;
  std::vector<double> lp;
  std::vector<float> row_out(vocab), base_row(vocab);
  std::deque<std::shared_ptr<RequestStream>> in_flight;
  size_t next = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    while (next < chunks.size() && in_flight.size() < static_cast<size_t>(std::max(1, o.in_flight))) {
      in_flight.push_back(submit_chunk(engine, chunks[next++]));
    }
    const std::vector<float> rows = collect_rows(*in_flight.front());
    in_flight.pop_front();
    if (rows.size() != static_cast<size_t>(o.ctx - 1) * vocab) {
      throw Error(ErrorKind::kInternal, "perplexity: chunk " + std::to_string(i) + " returned " + std::to_string(rows.size() / vocab) +
                                            " logits rows, expected " + std::to_string(o.ctx - 1));
    }
    const std::vector<int32_t>& c = chunks[i];
    for (int p = first; p < o.ctx - 1; ++p) {
      log_softmax(rows.data() + static_cast<size_t>(p) * vocab, vocab, lp);
      const auto target = static_cast<size_t>(c[static_cast<size_t>(p) + 1]);
      const double v = -lp[target];
      nll += v;
      nll2 += v * v;
      ++result.scored;
      if (save.is_open()) {
        for (size_t t = 0; t < vocab; ++t) row_out[t] = static_cast<float>(lp[t]);
        save.write(reinterpret_cast<const char*>(row_out.data()), static_cast<std::streamsize>(vocab * sizeof(float)));
      }
      if (base.is_open()) {
        base.read(reinterpret_cast<char*>(base_row.data()), static_cast<std::streamsize>(vocab * sizeof(float)));
        if (!base) throw_usage(o.kl_base + ": ends early (a partial or other file)");
        // This run's values as the file would hold them (f32), so a run against its own file gives exactly 0.
        double kl = 0.0;
        for (size_t t = 0; t < vocab; ++t) {
          const double b = base_row[t];
          kl += std::exp(b) * (b - static_cast<double>(static_cast<float>(lp[t])));
        }
        kls.push_back(std::max(0.0, kl));
        base_nll -= base_row[target];
        const size_t top = static_cast<size_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
        const size_t base_top = static_cast<size_t>(std::max_element(base_row.begin(), base_row.end()) - base_row.begin());
        agree += top == base_top ? 1 : 0;
      }
    }
    result.running_ppl.push_back(std::exp(nll / static_cast<double>(result.scored)));
  }
  if (save.is_open() && !save.flush()) throw_io(o.save_logprobs, "cannot write the log-probabilities");
  const auto count = static_cast<double>(result.scored);
  const double mean = nll / count;
  result.ppl = std::exp(mean);
  const double variance = nll2 / count - mean * mean;
  result.ppl_error = variance > 0 ? std::sqrt(variance / (count - 1)) * result.ppl : 0.0;
  if (base.is_open()) {
    KlStats k;
    double sum = 0.0;
    for (double v : kls) sum += v;
    k.mean = sum / count;
    k.median = percentile(kls, 0.5);
    k.p99 = percentile(kls, 0.99);
    k.max = kls.empty() ? 0.0 : *std::max_element(kls.begin(), kls.end());
    k.top1_agreement = static_cast<double>(agree) / count;
    k.base_ppl = std::exp(base_nll / count);
    k.delta_ppl = result.ppl - k.base_ppl;
    result.kl = k;
  }
  return result;
}

}  // namespace servetune::loadgen
