// draw_row and its pieces (see sample_row.h).
#include "backend/cpu/sample_row.h"

#include <algorithm>
#include <cmath>

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

double sum_in_lanes(std::span<const float> x) { return sum_in_lanes_of(x); }
double sum_in_lanes(std::span<const double> x) { return sum_in_lanes_of(x); }
size_t running_sum_index(std::span<const float> w, double r) { return running_sum_index_of(w, r); }
size_t running_sum_index(std::span<const double> w, double r) { return running_sum_index_of(w, r); }

size_t running_sum_index(std::span<const float> w, std::span<const double> block_sums, double r) {
  size_t b = 0;
  for (; b < block_sums.size() && r >= block_sums[b]; ++b) r -= block_sums[b];
  for (size_t i = b * static_cast<size_t>(kSumBlock); i < w.size(); ++i) {
    r -= static_cast<double>(w[i]);
    if (r < 0.0) return i;
  }
  for (size_t k = w.size(); k-- > 0;) {
    if (w[k] > 0) return k;
  }
  return 0;
}

size_t filtered_candidates(std::span<const float> logits, const SampleRow& row, std::vector<int32_t>& order,
                           std::vector<double>& p) {
  // Tokens whose tempered probability is below e^-40 of the best one carry < 1e-12 of the mass in any
  // vocabulary size used in practice; dropping them before sorting keeps full-vocabulary sampling cheap.
  const float best = *std::max_element(logits.begin(), logits.end());
  const float floor = best - 40.0f * row.temperature;
  const float inv_t = 1.0f / row.temperature;
  order.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] >= floor) order.push_back(static_cast<int32_t>(i));
  }
  size_t keep = order.size();
  if (row.top_k > 0) keep = std::min(keep, static_cast<size_t>(row.top_k));
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
  if (row.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / total;
      if (cum >= row.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  if (row.min_p > 0.0f) {
    const double threshold = row.min_p * p[0];
    size_t i = 1;
    while (i < cut && p[i] >= threshold) ++i;
    cut = i;
  }
  return cut;
}

int32_t draw_row(std::span<const float> logits, const SampleRow& row, SampleScratch& scratch) {
  if (row.temperature == 0.0f) return static_cast<int32_t>(argmax_first(logits));
  if (row.top_k <= 0 && row.top_p >= 1.0f && row.min_p <= 0.0f) {
    // Plain temperature sampling needs no ordering: one pass for the weights and their block sums (the normaliser is
    // the blocks' total), then a walk over the sums and one block's weights to find the draw.
    scratch.weights.resize(logits.size());
    scratch.block_sums.resize((logits.size() + kSumBlock - 1) / kSumBlock);
    exp_scaled_blocks(logits, max_value(logits), 1.0f / row.temperature, scratch.weights, scratch.block_sums);
    double total = 0.0;
    for (const double s : scratch.block_sums) total += s;
    return static_cast<int32_t>(running_sum_index(scratch.weights, scratch.block_sums, row.uniform * total));
  }
  const size_t cut = filtered_candidates(logits, row, scratch.order, scratch.p);
  const std::span<const double> kept = std::span<const double>(scratch.p).first(cut);
  return scratch.order[running_sum_index(kept, row.uniform * sum_in_lanes(kept))];
}

}  // namespace servetune::cpu
