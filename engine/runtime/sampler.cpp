// Sampling (see sampler.h). Filters follow vLLM's order: penalties, temperature, top-k, top-p, min-p.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/cpu/sample_row.h"
#include "backend/cpu/vector_math.h"
#include "core/error.h"

namespace servetune {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Log-softmax normaliser of the raw logits.
float log_sum_exp(std::span<const float> logits) {
  float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max));
  return max + static_cast<float>(std::log(sum));
}

// The temperature and filters of `p` as a SampleRow (no uniform drawn).
SampleRow filters(const SamplingParams& p) {
  SampleRow row;
  row.temperature = p.temperature;
  row.top_k = p.top_k;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  return row;
}

}  // namespace

void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - top);
  const double norm = top + std::log(sum);
  out.resize(logits.size());
  for (size_t v = 0; v < logits.size(); ++v) out[v] = static_cast<double>(logits[v]) - norm;
}

void validate_sampling_params(const SamplingParams& p) {
  auto bad = [](const std::string& what) { throw Error(ErrorKind::kInvalidRequest, what); };
  if (!(p.temperature >= 0.0f) || p.temperature > 100.0f) bad("temperature must be in [0, 100]");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) bad("top_p must be in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) bad("min_p must be in [0, 1]");
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) bad("presence_penalty must be in [-2, 2]");
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) bad("frequency_penalty must be in [-2, 2]");
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 10.0f)) bad("repetition_penalty must be in (0, 10]");
  if (p.max_tokens <= 0) bad("max_tokens must be at least 1, got " + std::to_string(p.max_tokens));
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) bad("min_tokens must be in [0, max_tokens]");
  if (p.logprobs > 20) bad("logprobs must be at most 20");
  for (const auto& s : p.stop) {
    if (s.empty()) bad("stop strings must not be empty");
  }
}

Sampler::Sampler(const SamplingParams& params, uint64_t default_seed, std::span<const int32_t> prompt)
    : params_(params), rng_(params.seed.value_or(default_seed)) {
  if (params_.repetition_penalty != 1.0f) seen_.insert(prompt.begin(), prompt.end());
}

void Sampler::accept(int32_t token) {
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) ++output_counts_[token];
  if (params_.repetition_penalty != 1.0f) seen_.insert(token);
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const auto vocab = static_cast<int32_t>(logits.size());
  for (const auto& [token, count] : output_counts_) {
    if (token < 0 || token >= vocab) continue;
    logits[static_cast<size_t>(token)] -= params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
  }
  const float rep = params_.repetition_penalty;
  for (int32_t token : seen_) {
    if (token < 0 || token >= vocab) continue;
    float& l = logits[static_cast<size_t>(token)];
    l = l > 0.0f ? l / rep : l * rep;
  }
}

template <class Choose>
SampleResult Sampler::sample_with(std::span<float> logits, std::span<const int32_t> banned, Choose&& choose) {
  SampleResult result;
  const auto vocab = static_cast<int32_t>(logits.size());
  if (!cpu::logits_usable(logits)) throw Error(ErrorKind::kInternal, "sampler: the logits hold NaN or +inf (the forward pass produced non-finite values)");
  float lse = 0.0f;
  if (params_.logprobs >= 0) {
    lse = log_sum_exp(logits);
    raw_.assign(logits.begin(), logits.end());
    result.top = top_logprobs(logits, params_.logprobs, lse);
  }

  apply_penalties(logits);
  for (int32_t b : banned) {
    if (b >= 0 && b < vocab) logits[static_cast<size_t>(b)] = kNegInf;
  }
  result.token = params_.greedy() ? static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())
                                  : choose();
  if (params_.logprobs >= 0) result.logprob = raw_[static_cast<size_t>(result.token)] - lse;
  return result;
}

SampleResult Sampler::sample(std::span<float> logits, std::span<const int32_t> banned, int32_t draft,
                            std::span<const float> draft_probs) {
  const int32_t one[] = {draft};
  const std::span<const int32_t> drafts = draft >= 0 ? std::span<const int32_t>(one) : std::span<const int32_t>();
  return sample_with(logits, banned, [&] { return draw(logits, drafts, draft_probs); });
}

SampleResult Sampler::sample_siblings(std::span<float> logits, std::span<const int32_t> banned,
                                      std::span<const int32_t> siblings) {
  return sample_with(logits, banned, [&] { return draw(logits, siblings, {}); });
}

const char* Sampler::device_refusal(std::span<const int32_t> banned) const {
  if (params_.logprobs >= 0) return "logprobs";
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f || params_.repetition_penalty != 1.0f) {
    return "presence, frequency or repetition penalty";
  }
  if (!banned.empty()) return "tokens banned before min_tokens";
  return nullptr;
}

SampleRow Sampler::device_row() {
  if (params_.greedy()) return SampleRow{};
  SampleRow row = filters(params_);
  // pick() draws uniform(0, total), which is this canonical draw times total (same RNG use, same value).
  row.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return row;
}

std::vector<TokenLogprob> Sampler::top_logprobs(std::span<const float> logits, int32_t n, float lse) {
  const auto vocab = static_cast<int32_t>(logits.size());
  const auto count = static_cast<size_t>(std::min(n, vocab));
  std::vector<int32_t>& order = scratch_.order;
  order.resize(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(count), order.end(), better);
  std::vector<TokenLogprob> top;
  for (size_t i = 0; i < count; ++i) top.push_back({order[i], logits[static_cast<size_t>(order[i])] - lse});
  return top;
}

size_t filtered_candidates(std::span<const float> logits, const SamplingParams& params, std::vector<int32_t>& order,
                           std::vector<double>& p) {
  return cpu::filtered_candidates(logits, filters(params), order, p);
}

int32_t Sampler::draw(std::span<const float> logits, std::span<const int32_t> drafts, std::span<const float> draft_probs) {
  // Candidates sorted by logit and cut by top-k; then top-p and min-p on the tempered distribution.
  const auto vocab = static_cast<int32_t>(logits.size());
  if (!draft_probs.empty() && (draft_probs.size() != logits.size() || drafts.size() != 1)) {
    throw Error(ErrorKind::kInternal, "a draft distribution verifies one draft of the vocabulary's size");
  }
  std::vector<int32_t> kept;  // drafts inside the vocabulary (one past it never matches)
  for (int32_t d : drafts) {
    if (d >= 0 && d < vocab) kept.push_back(d);
  }
  // Nothing to verify: the draw Backend::sample makes from the same row (the uniform is pick()'s draw).
  if (kept.empty()) return cpu::draw_row(logits, device_row(), scratch_);
  std::vector<int32_t>& order = scratch_.order;
  std::vector<double>& probs = scratch_.p;
  std::vector<size_t> index(kept.size());
  if (params_.top_k <= 0 && params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    // Plain temperature sampling: every token is a candidate, in id order.
    scratch_.weights.resize(logits.size());
    cpu::exp_scaled(logits, cpu::max_value(logits), 1.0f / params_.temperature, scratch_.weights);
    order.resize(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    probs.assign(scratch_.weights.begin(), scratch_.weights.end());
    for (size_t i = 0; i < kept.size(); ++i) index[i] = static_cast<size_t>(kept[i]);
    return pick(logits.size(), kept, index, draft_probs);
  }
  const size_t cut = filtered_candidates(logits, params_, order, probs);
  // A draft outside the kept candidates has probability 0 (index == cut): it is always rejected.
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto it = std::find(order.begin(), order.begin() + static_cast<long>(cut), kept[i]);
    index[i] = static_cast<size_t>(it - order.begin());
  }
  return pick(cut, kept, index, draft_probs);
}

int32_t Sampler::pick(size_t n, std::span<const int32_t> drafts, std::span<const size_t> draft_index,
                      std::span<const float> draft_probs) {
  std::vector<double>& probs = scratch_.p;
  const std::vector<int32_t>& candidates = scratch_.order;
  double total = cpu::sum_in_lanes(std::span<const double>(probs).first(n));
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  if (draft_probs.empty()) {
    // Lossless verification of deterministic drafts d_1, d_2, ... (one, or a tree node's children) in order: accept
    // d_i with probability p_i(d_i), where p_i is p without d_1 .. d_{i-1} renormalised; after the last rejection
    // draw from p without all of them. P(d_i) = p(d_i) and P(x) = p(x) otherwise (for one draft: accept with p(d),
    // else draw from max(0, p - onehot(d)) renormalised).
    for (size_t i = 0; i < drafts.size(); ++i) {
      const size_t at = draft_index[i];
      if (at >= n) continue;  // filtered out: probability 0
      if (unit(rng_) * total < probs[at]) return drafts[i];
      if (!broken_verification_) {
        total -= probs[at];
        probs[at] = 0.0;
      }
    }
  } else {
    // Speculative sampling (Leviathan et al.) of a draft d drawn from q: accept with min(1, p(d) / q(d)); on
    // rejection draw from max(0, p - q) renormalised. Overall P(x) = min(p, q)(x) + (1 - sum min(p, q)) r(x) = p(x).
    const int32_t draft = drafts[0];
    const bool draft_kept = draft_index[0] < n;
    const double p_draft = draft_kept ? probs[draft_index[0]] / total : 0.0;
    const double q_draft = draft_probs[static_cast<size_t>(draft)];
    if (unit(rng_) * q_draft < p_draft) return draft;
    if (!broken_verification_) {
      double residual = 0.0;
      for (size_t i = 0; i < n; ++i) {
        residual += std::max(0.0, probs[i] / total - static_cast<double>(draft_probs[static_cast<size_t>(candidates[i])]));
      }
      // residual == 0 only when p == q up to rounding; then a rejection is a rounding artefact and p is right.
      if (residual > 0.0) {
        for (size_t i = 0; i < n; ++i) {
          probs[i] = std::max(0.0, probs[i] / total - static_cast<double>(draft_probs[static_cast<size_t>(candidates[i])]));
        }
        total = residual;
      }
    }
  }
  const double r = unit(rng_) * total;  // Sampler::device_row hands the device this same draw
  return candidates[cpu::running_sum_index(std::span<const double>(probs).first(n), r)];
}

}  // namespace servetune
