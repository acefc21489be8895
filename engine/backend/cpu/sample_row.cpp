// draw_row and its pieces (see sample_row.h).
#include "backend/cpu/sample_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "backend/cpu/lane_sums.h"
#include "backend/cpu/vector_math.h"

namespace servetune::cpu {
namespace {

template <class T>
double sum_in_lanes_of(std::span<const T> x) {
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

// Weight by weight from i, where r (what is left of the draw) runs out; rounding that leaves r >= 0 at the end picks
// the last index with any weight.
template <class T>
size_t running_sum_index_from(std::span<const T> w, size_t i, double r) {
  for (; i < w.size(); ++i) {
    r -= static_cast<double>(w[i]);
    if (r < 0.0) return i;
  }
  for (size_t k = w.size(); k-- > 0;) {
    if (w[k] > 0) return k;
  }
  return 0;
}

// Whole blocks first (their sums vectorise), then weight by weight inside the block where r runs out.
template <class T>
size_t running_sum_index_of(std::span<const T> w, double r) {
  constexpr size_t kBlock = 256;
  size_t i = 0;
  for (; i + kBlock <= w.size(); i += kBlock) {
    const double block = sum_in_lanes_of(w.subspan(i, kBlock));
    if (r < block) break;
    r -= block;
  }
  return running_sum_index_from(w, i, r);
}

}  // namespace

double sum_in_lanes(std::span<const float> x) { return sum_in_lanes_of(x); }
double sum_in_lanes(std::span<const double> x) { return sum_in_lanes_of(x); }
size_t running_sum_index(std::span<const float> w, double r) { return running_sum_index_of(w, r); }
size_t running_sum_index(std::span<const double> w, double r) { return running_sum_index_of(w, r); }

size_t running_sum_index(std::span<const float> w, std::span<const double> block_sums, double r) {
  size_t b = 0;
  for (; b < block_sums.size() && r >= block_sums[b]; ++b) r -= block_sums[b];
  return running_sum_index_from(w, b * static_cast<size_t>(kSumBlock), r);
}

namespace {

// Tokens are first gathered above this weight (relative to the best token's), then each retry below the last.
constexpr float kFirstThreshold = 0x1p-12f;
constexpr float kThresholdStep = 0x1p-12f;
// Below e^-40 (about 2^-57.7): every candidate's weight is above it.
constexpr float kEveryCandidate = 0x1p-58f;
// Weights are floats, the cut's probabilities doubles: a set is trusted to hold the cut only with this much room.
constexpr double kRoom = 1e-5;

// The tempered weights of every token (e^((logit - best) * inv_t)) and their 256-weight block sums, as
// exp_scaled_blocks makes them; returns the vocabulary's mass, the blocks' total.
double vocabulary_weights(std::span<const float> logits, float best, float inv_t, std::vector<float>& weights,
                          std::vector<double>& block_sums) {
  weights.resize(logits.size());
  block_sums.resize((logits.size() + kSumBlock - 1) / kSumBlock);
  exp_scaled_blocks(logits, best, inv_t, weights, block_sums);
  double total = 0.0;
  for (const double b : block_sums) total += b;
  return total;
}

// A token's place in the ranking as one integer: larger logit first, then lower id (the logit is finite; -0 and +0
// tie, as they compare equal).
uint64_t rank_key(float logit, int32_t id) {
  if (logit == 0.0f) logit = 0.0f;
  uint32_t u;
  std::memcpy(&u, &logit, 4);
  u = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
  return static_cast<uint64_t>(u) << 32 | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
int32_t id_of(uint64_t key) { return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key)); }

}  // namespace

size_t filtered_candidates(std::span<const float> logits, const SampleRow& row, std::vector<int32_t>& order,
                           std::vector<double>& p) {
  const auto top = static_cast<int32_t>(argmax_first(logits));
  const float best = logits[static_cast<size_t>(top)];
  order.clear();
  p.clear();
  if (!std::isfinite(best)) {
    order.push_back(top);
    p.push_back(1.0);
    return 1;
  }
  const float floor = best - 40.0f * row.temperature;
  const float inv_t = 1.0f / row.temperature;
  // Weights of the whole vocabulary (as a plain temperature draw computes them) locate the tokens worth sorting.
  thread_local std::vector<float> weights;
  thread_local std::vector<double> block_sums;
  thread_local std::vector<uint64_t> keys;
  const double vocab_mass = vocabulary_weights(logits, best, inv_t, weights, block_sums);

  // The candidates with weight >= theta, lowering theta until they surely hold every token the cut keeps.
  float theta = row.top_k <= 0 && row.min_p > 0.0f ? static_cast<float>(row.min_p * (1.0 - kRoom)) : kFirstThreshold;
  for (;; theta *= kThresholdStep) {
    const bool all = theta < kEveryCandidate;
    double gathered = 0.0;
    order.resize(logits.size());
    order.resize(collect_at_least(weights, logits, all ? 0.0f : theta, floor, order.data(), &gathered));
    // Top-k: the k best candidates have the k largest logits, so they are all gathered once k are.
    if (row.top_k > 0 && !all && order.size() < static_cast<size_t>(row.top_k)) continue;
    if (!all) {
      // Then every token whose logit reaches the lowest gathered one: a prefix of the ranking, whatever ulp the
      // vector exp rounded a weight by.
      float lowest = best;
      for (const int32_t id : order) lowest = std::min(lowest, logits[static_cast<size_t>(id)]);
      order.resize(logits.size());
      order.resize(collect_at_least(weights, logits, 0.0f, std::max(floor, lowest), order.data(), &gathered));
    }
    // Without top-k every candidate is in the running and top-p's mass is the vocabulary's; tokens below theta
    // are all under min-p's threshold, or too light to be reached before top-p's mass is.
    const bool holds_min_p = row.top_k <= 0 && row.min_p > 0.0f && theta <= row.min_p * (1.0 - kRoom);
    const bool holds_top_p = row.top_k <= 0 && row.top_p < 1.0f && gathered >= row.top_p * vocab_mass * (1.0 + kRoom);
    if (row.top_k <= 0 && !all && !holds_min_p && !holds_top_p) continue;

    keys.resize(order.size());
    for (size_t i = 0; i < order.size(); ++i) keys[i] = rank_key(logits[static_cast<size_t>(order[i])], order[i]);
    const auto tempered = [&](uint64_t key) {
      return std::exp(static_cast<double>((logits[static_cast<size_t>(id_of(key))] - best) * inv_t));
    };
    // Ranked a growing prefix at a time, only as far as the cuts look.
    size_t sorted = 0, chunk = 256;
    const auto sort_more = [&] {
      const size_t next = std::min(keys.size(), sorted + chunk);
      chunk *= 4;
      const auto first = keys.begin() + static_cast<long>(sorted), mid = keys.begin() + static_cast<long>(next);
      if (next < keys.size()) std::nth_element(first, mid, keys.end(), std::greater<>());
      std::sort(first, mid, std::greater<>());
      for (size_t i = sorted; i < next; ++i) p.push_back(tempered(keys[i]));
      sorted = next;
    };
    size_t limit = keys.size();
    double total = vocab_mass;
    if (row.top_k > 0) {
      // Top-p's mass is the top k's, in rank order.
      limit = std::min(limit, static_cast<size_t>(row.top_k));
      std::partial_sort(keys.begin(), keys.begin() + static_cast<long>(limit), keys.end(), std::greater<>());
      for (size_t i = 0; i < limit; ++i) p.push_back(tempered(keys[i]));
      sorted = limit;
      total = 0.0;
      for (size_t i = 0; i < limit; ++i) total += p[i];
    }
    size_t cut = limit;
    if (row.top_p < 1.0f) {
      double cum = 0.0;
      bool reached = false;
      for (size_t i = 0; i < limit && !reached; ++i) {
        if (i == sorted) sort_more();
        cum += p[i] / total;
        if (cum >= row.top_p) {
          cut = i + 1;
          reached = true;
        }
      }
      // Rounding left top-p's cut past the gathered tokens: gather more.
      if (!reached && row.top_k <= 0 && !all && !holds_min_p) {
        p.clear();
        continue;
      }
    }
    if (row.min_p > 0.0f) {
      if (sorted == 0) sort_more();
      const double threshold = row.min_p * p[0];
      size_t i = 1;
      for (; i < cut; ++i) {
        if (i == sorted) sort_more();
        if (p[i] < threshold) break;
      }
      cut = i;
    }
    while (sorted < cut) sort_more();
    for (size_t i = 0; i < cut; ++i) order[i] = id_of(keys[i]);
    return cut;
  }
}

bool logits_usable(std::span<const float> logits) {
  bool ok = true;
  for (const float x : logits) ok &= x < INFINITY;  // NaN compares false, +inf is not below itself
  return ok;
}

int32_t draw_row(std::span<const float> logits, const SampleRow& row, SampleScratch& scratch) {
  if (row.temperature == 0.0f) return static_cast<int32_t>(argmax_first(logits));
  if (row.top_k <= 0 && row.top_p >= 1.0f && row.min_p <= 0.0f) {
    // Plain temperature sampling needs no ordering: one pass for the weights and their block sums (the normaliser is
    // the blocks' total), then a walk over the sums and one block's weights to find the draw.
    const double total =
        vocabulary_weights(logits, max_value(logits), 1.0f / row.temperature, scratch.weights, scratch.block_sums);
    return static_cast<int32_t>(running_sum_index(scratch.weights, scratch.block_sums, row.uniform * total));
  }
  const size_t cut = filtered_candidates(logits, row, scratch.order, scratch.p);
  const std::span<const double> kept = std::span<const double>(scratch.p).first(cut);
  return scratch.order[running_sum_index(kept, row.uniform * sum_in_lanes(kept))];
}

}  // namespace servetune::cpu
