// Bayesian search as a tree-structured Parzen estimator (TPE, as Optuna's default sampler and Hyperopt): the baseline
// and `startup` candidates drawn at random (seeded) first, then one candidate per batch: the measured ones split into
// good (the best quarter by the goal; at least one) and bad (the rest, plus failed and SLO-infeasible ones), each
// dimension's values counted in both with a Laplace prior, and the unmeasured runnable candidate with the largest
// l(x) / g(x) = prod over dimensions of P(value | good) / P(value | bad) goes next. Every dimension is treated as
// categorical (a sweep space lists its values). Skipped candidates (constraints, validity rules) are never proposed.
// A decision reads only the results of the candidates proposed before it, so replaying over stored results (resume,
// report) proposes the same candidates.
#include "tuner/strategy_bayes.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace servetune::tuner {
namespace {

constexpr double kGoodFraction = 0.25;

class BayesStrategy : public Strategy {
 public:
  BayesStrategy(const SweepSpec& spec, const SearchSpace& space) : spec_(spec), space_(space) {
    for (size_t i = 0; i < space.size(); ++i) {
      const Candidate c = space.at(i);
      if (!c.skip_reason.empty()) continue;
      runnable_.push_back(c);
      std::vector<size_t> values;
      for (const Dimension& d : spec.space) {
        const auto& v = c.settings.at(d.name);
        values.push_back(static_cast<size_t>(std::find(d.values.begin(), d.values.end(), v) - d.values.begin()));
      }
      value_index_.push_back(std::move(values));
    }
    budget_ = std::min<size_t>(static_cast<size_t>(spec.strategy.budget), runnable_.size());
  }

  std::optional<Batch> next(const ResultsTable& results) override {
    const Goal goal = goal_of(spec_);
    if (proposed_.empty()) return first_batch();
    if (proposed_.size() >= budget_) {
      StageSummary& s = stages_.back();
      if (s.winner.empty()) s.winner = best_of(results, s.candidates, goal).value_or("");
      return std::nullopt;
    }
    const size_t pick = most_promising(results, goal);
    proposed_.push_back(pick);
    stages_.back().candidates.push_back(runnable_[pick].id);
    return Batch{"bayes", {{runnable_[pick], "main", spec_.workloads}}};
  }

  size_t planned_runs() const override { return budget_ * max_runs(spec_.workloads, spec_.repeat); }

 private:
  // The baseline (when runnable), then random runnable candidates up to `startup` (never more than the budget).
  std::optional<Batch> first_batch() {
    if (budget_ == 0) return std::nullopt;
    const size_t startup = std::min<size_t>(static_cast<size_t>(spec_.strategy.startup), budget_);
    const std::string baseline = space_.baseline().id;
    for (size_t i = 0; i < runnable_.size(); ++i) {
      if (runnable_[i].id == baseline) proposed_.push_back(i);
    }
    std::vector<size_t> order(runnable_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::mt19937_64 rng(spec_.strategy.seed);
    std::shuffle(order.begin(), order.end(), rng);
    for (const size_t i : order) {
      if (proposed_.size() >= startup) break;
      if (std::find(proposed_.begin(), proposed_.end(), i) == proposed_.end()) proposed_.push_back(i);
    }
    Batch b{"bayes", {}};
    StageSummary s;
    s.name = "bayes";
    for (const auto& d : spec_.space) {
      if (d.values.size() > 1) s.dims.push_back(d.name);
    }
    s.workload = spec_.objective.workload;
    s.incumbent = baseline;
    for (const size_t i : proposed_) {
      b.trials.push_back({runnable_[i], "main", spec_.workloads});
      s.candidates.push_back(runnable_[i].id);
    }
    stages_.push_back(s);
    return b;
  }

  size_t most_promising(const ResultsTable& results, const Goal& goal) const {
    // Good: the best quarter of the measured, feasible candidates; bad: everything else proposed so far.
    std::vector<std::pair<double, size_t>> ok;
    std::vector<size_t> bad;
    for (const size_t i : proposed_) {
      const Score s = score(results, runnable_[i].id, goal);
      if (s.measured && s.feasible) ok.emplace_back(goal.maximize ? -s.value : s.value, i);
      else bad.push_back(i);
    }
    std::stable_sort(ok.begin(), ok.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const size_t n_good = ok.empty() ? 0 : std::max<size_t>(1, static_cast<size_t>(std::ceil(kGoodFraction * static_cast<double>(ok.size()))));
    std::vector<size_t> good;
    for (size_t k = 0; k < ok.size(); ++k) (k < n_good ? good : bad).push_back(ok[k].second);
    // Per dimension and value: how often it occurs among the good and among the bad.
    const auto counts = [&](const std::vector<size_t>& set) {
      std::vector<std::vector<double>> c;
      for (const Dimension& d : spec_.space) c.emplace_back(d.values.size(), 0.0);
      for (const size_t i : set) {
        for (size_t d = 0; d < c.size(); ++d) c[d][value_index_[i][d]] += 1.0;
      }
      return c;
    };
    const auto in_good = counts(good), in_bad = counts(bad);
    size_t best = runnable_.size();
    double best_ratio = -INFINITY;
    for (size_t i = 0; i < runnable_.size(); ++i) {
      if (std::find(proposed_.begin(), proposed_.end(), i) != proposed_.end()) continue;
      double log_ratio = 0.0;
      for (size_t d = 0; d < spec_.space.size(); ++d) {
        const auto n_values = static_cast<double>(spec_.space[d].values.size());
        const size_t v = value_index_[i][d];
        log_ratio += std::log((in_good[d][v] + 1.0) / (static_cast<double>(good.size()) + n_values)) -
                     std::log((in_bad[d][v] + 1.0) / (static_cast<double>(bad.size()) + n_values));
      }
      if (log_ratio > best_ratio) {  // ties: the earlier candidate
        best_ratio = log_ratio;
        best = i;
      }
    }
    return best;
  }

  const SweepSpec& spec_;
  const SearchSpace& space_;
  std::vector<Candidate> runnable_;
  std::vector<std::vector<size_t>> value_index_;  // per runnable candidate, its value's index in each dimension
  std::vector<size_t> proposed_;                  // indices into runnable_, in proposal order
  size_t budget_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_bayes_strategy(const SweepSpec& spec, const SearchSpace& space) {
  return std::make_unique<BayesStrategy>(spec, space);
}

}  // namespace servetune::tuner
