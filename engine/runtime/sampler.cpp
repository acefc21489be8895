// Sampling (see sampler.h). Filters follow vLLM's order: penalties, temperature, top-k, top-p, min-p.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

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

// Sum in double with eight independent partial sums (vectorisable, and the same order on every machine).
template <class T>
double sum_in_lanes(std::span<const T> x) {
  constexpr size_t kLanes = 8;
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= x.size(); i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(x[i + l]);
  }
  for (; i < x.size(); ++i) lane[0] += static_cast<double>(x[i]);
  double total = 0.0;
  for (double v : lane) total += v;
  return total;
}

// The index at which r (drawn below the sum of w) runs out in w's running sum: whole blocks first (their sums
// vectorise), then weight by weight inside the block where r runs out. Rounding that leaves r >= 0 picks the last
// index with any weight.
template <class T>
size_t running_sum_index(std::span<const T> w, double r) {
  constexpr size_t kBlock = 256;
  size_t i = 0;
  for (; i + kBlock <= w.size(); i += kBlock) {
    const double block = sum_in_lanes(w.subspan(i, kBlock));
    if (r < block) break;
    r -= block;
  }
  for (; i < w.size(); ++i) {
    r -= static_cast<double>(w[i]);
    if (r < 0.0) return i;
  }
  for (size_t k = w.size(); k-- > 0;) {
    if (w[k] > 0) return k;
  }
  return 0;
}

}  // namespace

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

SampleResult Sampler::sample(std::span<float> logits, std::span<const int32_t> banned, int32_t draft,
                            std::span<const float> draft_probs) {
  SampleResult result;
  const auto vocab = static_cast<int32_t>(logits.size());
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
                                  : draw(logits, draft, draft_probs);
  if (params_.logprobs >= 0) result.logprob = raw_[static_cast<size_t>(result.token)] - lse;
  return result;
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
  SampleRow row;
  if (params_.greedy()) return row;
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  row.min_p = params_.min_p;
  // pick() draws uniform(0, total), which is this canonical draw times total (same RNG use, same value).
  row.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return row;
}

std::vector<TokenLogprob> Sampler::top_logprobs(std::span<const float> logits, int32_t n, float lse) {
  const auto vocab = static_cast<int32_t>(logits.size());
  const auto count = static_cast<size_t>(std::min(n, vocab));
  candidates_.resize(static_cast<size_t>(vocab));
  std::iota(candidates_.begin(), candidates_.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<long>(count), candidates_.end(), better);
  std::vector<TokenLogprob> top;
  for (size_t i = 0; i < count; ++i) top.push_back({candidates_[i], logits[static_cast<size_t>(candidates_[i])] - lse});
  return top;
}

size_t filtered_candidates(std::span<const float> logits, const SamplingParams& params, std::vector<int32_t>& order,
                           std::vector<double>& p) {
  // Tokens whose tempered probability is below e^-40 of the best one carry < 1e-12 of the mass in any
  // vocabulary size used in practice; dropping them before sorting keeps full-vocabulary sampling cheap.
  const float best = *std::max_element(logits.begin(), logits.end());
  const float floor = best - 40.0f * params.temperature;
  const float inv_t = 1.0f / params.temperature;
  order.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] >= floor) order.push_back(static_cast<int32_t>(i));
  }
  size_t keep = order.size();
  if (params.top_k > 0) keep = std::min(keep, static_cast<size_t>(params.top_k));
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(keep), order.end(), [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  });
  p.resize(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp(static_cast<double>((logits[static_cast<size_t>(order[i])] - best) * inv_t));
    total += p[i];
  }
  size_t cut = keep;
  if (params.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / total;
      if (cum >= params.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  if (params.min_p > 0.0f) {
    const double threshold = params.min_p * p[0];
    size_t i = 1;
    while (i < cut && p[i] >= threshold) ++i;
    cut = i;
  }
  return cut;
}

int32_t Sampler::draw(std::span<const float> logits, int32_t draft, std::span<const float> draft_probs) {
  // Candidates sorted by logit and cut by top-k; then top-p and min-p on the tempered distribution.
  const auto vocab = static_cast<int32_t>(logits.size());
  if (!draft_probs.empty() && draft_probs.size() != logits.size()) {
    throw Error(ErrorKind::kInternal, "draft distribution size differs from the vocabulary");
  }
  if (draft >= vocab) draft = -1;
  if (params_.top_k <= 0 && params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    // Plain temperature sampling needs no ordering: one pass for the normaliser, one to find the draw.
    exp_.resize(logits.size());
    cpu::exp_scaled(logits, cpu::max_value(logits), 1.0f / params_.temperature, exp_);
    if (draft < 0) {
      // Nothing to verify: the draw pick() would make, read straight from the tempered weights (index = token).
      const std::span<const float> weights(exp_);
      const double total = sum_in_lanes(weights);
      const double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * total;
      return static_cast<int32_t>(running_sum_index(weights, r));
    }
    candidates_.resize(static_cast<size_t>(vocab));
    std::iota(candidates_.begin(), candidates_.end(), 0);
    probs_.assign(exp_.begin(), exp_.end());
    return pick(logits.size(), draft, static_cast<size_t>(draft), draft_probs);
  }
  const size_t cut = filtered_candidates(logits, params_, candidates_, probs_);
  // A draft outside the kept candidates has probability 0 (draft_index == cut): it is always rejected.
  size_t draft_index = 0;
  if (draft >= 0) {
    const auto it = std::find(candidates_.begin(), candidates_.begin() + static_cast<long>(cut), draft);
    draft_index = static_cast<size_t>(it - candidates_.begin());
  }
  return pick(cut, draft, draft_index, draft_probs);
}

int32_t Sampler::pick(size_t n, int32_t draft, size_t draft_index, std::span<const float> draft_probs) {
  double total = sum_in_lanes(std::span<const double>(probs_).first(n));
  const bool draft_kept = draft >= 0 && draft_index < n;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  if (draft >= 0 && draft_probs.empty() && draft_kept) {
    // Lossless verification of a deterministic draft d: accept with probability p(d); on rejection draw from
    // max(0, p - onehot(d)) renormalised, i.e. p without d. P(d) = p(d), P(x != d) = (1 - p(d)) p(x) / (1 - p(d)).
    if (unit(rng_) * total < probs_[draft_index]) return draft;
    if (!broken_verification_) {
      total -= probs_[draft_index];
      probs_[draft_index] = 0.0;
    }
  } else if (draft >= 0 && !draft_probs.empty()) {
    // Speculative sampling (Leviathan et al.) of a draft d drawn from q: accept with min(1, p(d) / q(d)); on
    // rejection draw from max(0, p - q) renormalised. Overall P(x) = min(p, q)(x) + (1 - sum min(p, q)) r(x) = p(x).
    const double p_draft = draft_kept ? probs_[draft_index] / total : 0.0;
    const double q_draft = draft_probs[static_cast<size_t>(draft)];
    if (unit(rng_) * q_draft < p_draft) return draft;
    if (!broken_verification_) {
      double residual = 0.0;
      for (size_t i = 0; i < n; ++i) {
        residual += std::max(0.0, probs_[i] / total - static_cast<double>(draft_probs[static_cast<size_t>(candidates_[i])]));
      }
      // residual == 0 only when p == q up to rounding; then a rejection is a rounding artefact and p is right.
      if (residual > 0.0) {
        for (size_t i = 0; i < n; ++i) {
          probs_[i] = std::max(0.0, probs_[i] / total - static_cast<double>(draft_probs[static_cast<size_t>(candidates_[i])]));
        }
        total = residual;
      }
    }
  }
  const double r = unit(rng_) * total;  // Sampler::device_row hands the device this same draw
  return candidates_[running_sum_index(std::span<const double>(probs_).first(n), r)];
}

}  // namespace servetune
