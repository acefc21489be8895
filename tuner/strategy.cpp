// Grid, staged and successive-halving strategies (see strategy.h).
#include "tuner/strategy.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "servetune/error.h"
#include "tuner/strategy_bayes.h"

namespace servetune::tuner {
namespace {

constexpr size_t kMaxGrid = 100000;

std::vector<std::string> ids_of(const std::vector<Trial>& trials) {
  std::vector<std::string> out;
  for (const auto& t : trials) {
    if (t.candidate.skip_reason.empty()) out.push_back(t.candidate.id);
  }
  return out;
}

class GridStrategy : public Strategy {
 public:
  GridStrategy(const SweepSpec& spec, const SearchSpace& space) : spec_(spec), space_(space) {
    if (space.size() > kMaxGrid) {
      throw_usage(spec.source + ": strategy: a grid of " + std::to_string(space.size()) + " candidates is too large; use staged or halving");
    }
  }
  std::optional<Batch> next(const ResultsTable& results) override {
    if (done_) {
      if (!stages_.empty() && stages_[0].winner.empty()) {
        stages_[0].winner = best_of(results, stages_[0].candidates, goal_of(spec_)).value_or("");
      }
      return std::nullopt;
    }
    done_ = true;
    Batch b{"grid", {}};
    for (size_t i = 0; i < space_.size(); ++i) b.trials.push_back({space_.at(i), "main", spec_.workloads});
    StageSummary s;
    s.name = "grid";
    for (const auto& d : spec_.space) {
      if (d.values.size() > 1) s.dims.push_back(d.name);
    }
    s.workload = spec_.objective.workload;
    s.candidates = ids_of(b.trials);
    s.incumbent = space_.baseline().id;
    stages_.push_back(s);
    return b;
  }
  size_t planned_runs() const override { return space_.size() * max_runs(spec_.workloads, spec_.repeat); }

 private:
  const SweepSpec& spec_;
  const SearchSpace& space_;
  bool done_ = false;
};

class StagedStrategy : public Strategy {
 public:
  StagedStrategy(const SweepSpec& spec, const SearchSpace& space) : spec_(spec), space_(space), incumbent_(space.baseline()) {}

  std::optional<Batch> next(const ResultsTable& results) override {
    const Goal goal = goal_of(spec_);
    if (stage_ > 0) {
      StageSummary& prev = stages_.back();
      std::vector<std::string> ids = {incumbent_.id};  // the incumbent wins ties
      for (const auto& id : prev.candidates) ids.push_back(id);
      const auto w = best_of(results, ids, goal);
      if (w && *w != incumbent_.id) {
        // A lead inside the repeats' noise does not move the search: the incumbent stays.
        if (beats_beyond_noise(results, incumbent_.id, *w, goal)) {
          incumbent_ = by_id_.at(*w);
        } else {
          prev.not_promoted = *w;
        }
      }
      prev.winner = incumbent_.id;
    }
    if (stage_ == spec_.strategy.stages.size()) return std::nullopt;
    const StageSpec& st = spec_.strategy.stages[stage_++];
    Batch b{st.name, {}};
    std::vector<const Dimension*> dims;
    for (const auto& name : st.dims) dims.push_back(spec_.dimension(name));
    std::vector<size_t> digit(dims.size(), 0);
    std::set<std::string> seen;
    for (;;) {
      nlohmann::ordered_json settings = incumbent_.settings;
      for (size_t i = 0; i < dims.size(); ++i) settings[dims[i]->name] = dims[i]->values[digit[i]];
      const Candidate c = space_.find(settings);
      if (seen.insert(c.id).second) {
        b.trials.push_back({c, "main", spec_.workloads});
        by_id_.emplace(c.id, c);
      }
      size_t i = dims.size();
      while (i > 0 && ++digit[i - 1] == dims[i - 1]->values.size()) digit[--i] = 0;
      if (i == 0) break;
    }
    if (!by_id_.count(incumbent_.id)) by_id_.emplace(incumbent_.id, incumbent_);
    StageSummary s;
    s.name = st.name;
    s.dims = st.dims;
    s.workload = spec_.objective.workload;
    s.candidates = ids_of(b.trials);
    s.incumbent = incumbent_.id;
    stages_.push_back(s);
    return b;
  }

  size_t planned_runs() const override {
    size_t n = 0;
    for (const auto& st : spec_.strategy.stages) {
      size_t k = 1;
      for (const auto& d : st.dims) k *= spec_.dimension(d)->values.size();
      n += k;
    }
    return n * max_runs(spec_.workloads, spec_.repeat);
  }

 private:
  const SweepSpec& spec_;
  const SearchSpace& space_;
  Candidate incumbent_;
  size_t stage_ = 0;
  std::map<std::string, Candidate> by_id_;
};

class HalvingStrategy : public Strategy {
 public:
  HalvingStrategy(const SweepSpec& spec, const SearchSpace& space) : spec_(spec), space_(space) {
    if (space.size() > kMaxGrid) throw_usage(spec.source + ": strategy: " + std::to_string(space.size()) + " candidates is too many for halving");
    for (size_t i = 0; i < space.size(); ++i) {
      Candidate c = space.at(i);
      if (c.skip_reason.empty()) survivors_.push_back(c.id);
      all_.push_back(std::move(c));
    }
  }

  std::optional<Batch> next(const ResultsTable& results) override {
    const Goal goal = goal_of(spec_);
    const auto& rungs = spec_.strategy.screen_prompts;
    if (rung_ > 0 && rung_ <= rungs.size()) {
      // Rank the rung's candidates on its screening workload and keep the best fraction.
      Goal g = goal;
      g.workload = stages_.back().workload;
      std::vector<std::string> ranked = survivors_;
      std::stable_sort(ranked.begin(), ranked.end(), [&](const std::string& a, const std::string& b) {
        return better(score(results, a, g), score(results, b, g), g.maximize);
      });
      size_t keep = std::max<size_t>(1, static_cast<size_t>(std::ceil(spec_.strategy.keep * static_cast<double>(ranked.size()))));
      // With repeats, a candidate the last kept one does not beat beyond noise goes on too: screening does not drop
      // what it cannot tell apart (the rung then keeps more than its fraction).
      while (keep < ranked.size() && !beats_beyond_noise(results, ranked[keep], ranked[keep - 1], g) &&
             compare_scores(results, ranked[keep], ranked[keep - 1], g)) {
        ++keep;
      }
      ranked.resize(std::min(keep, ranked.size()));
      survivors_ = ranked;
      stages_.back().winner = ranked.front();
      stages_.back().kept = ranked.size();
    } else if (rung_ > rungs.size()) {
      if (stages_.back().winner.empty()) stages_.back().winner = best_of(results, stages_.back().candidates, goal).value_or("");
      return std::nullopt;
    }
    Batch b;
    const std::string baseline = space_.baseline().id;
    if (rung_ < rungs.size()) {
      WorkloadSpec w = *spec_.objective_workloads().front();
      w.data.num_prompts = rungs[rung_];
      w.name = w.group = w.name + "@screen" + std::to_string(rungs[rung_]);
      b.stage = "screen " + std::to_string(rung_ + 1) + " (" + std::to_string(rungs[rung_]) + " prompts)";
      for (const auto& c : all_) {
        if (rung_ == 0 || std::find(survivors_.begin(), survivors_.end(), c.id) != survivors_.end()) {
          b.trials.push_back({c, "screen" + std::to_string(rungs[rung_]), {w}});
        }
      }
      StageSummary s;
      s.name = b.stage;
      s.workload = w.name;
      s.candidates = ids_of(b.trials);
      s.incumbent = stages_.empty() ? baseline : stages_.back().winner;  // the previous rung's leader
      stages_.push_back(s);
    } else {
      b.stage = "final";
      std::vector<std::string> finalists = survivors_;
      if (std::find(finalists.begin(), finalists.end(), baseline) == finalists.end() && space_.baseline().skip_reason.empty()) {
        finalists.insert(finalists.begin(), baseline);
      }
      for (const auto& c : all_) {
        if (std::find(finalists.begin(), finalists.end(), c.id) != finalists.end()) b.trials.push_back({c, "main", spec_.workloads});
      }
      StageSummary s;
      s.name = "final";
      s.workload = spec_.objective.workload;
      s.candidates = ids_of(b.trials);
      s.incumbent = baseline;
      stages_.push_back(s);
    }
    ++rung_;
    return b;
  }

  size_t planned_runs() const override {
    double n = static_cast<double>(all_.size());
    double runs = 0.0;
    for (size_t r = 0; r < spec_.strategy.screen_prompts.size(); ++r) {
      runs += n;
      n = std::max(1.0, std::ceil(n * spec_.strategy.keep));
    }
    runs += (n + 1) * static_cast<double>(spec_.workloads.size());
    return static_cast<size_t>(runs) * static_cast<size_t>(spec_.repeat);
  }

 private:
  const SweepSpec& spec_;
  const SearchSpace& space_;
  std::vector<Candidate> all_;
  std::vector<std::string> survivors_;
  size_t rung_ = 0;
};

}  // namespace

Goal goal_of(const SweepSpec& spec) {
  Goal g;
  g.workload = spec.objective.workload;
  g.metric = spec.objective.metric;
  g.maximize = spec.objective.maximize;
  g.slo = spec.slo;
  g.max_failed_fraction = spec.target.max_failed_fraction;
  g.tiebreak = spec.objective.tiebreak;
  return g;
}

std::unique_ptr<Strategy> Strategy::make(const SweepSpec& spec, const SearchSpace& space) {
  if (spec.strategy.kind == "staged") return std::make_unique<StagedStrategy>(spec, space);
  if (spec.strategy.kind == "halving") return std::make_unique<HalvingStrategy>(spec, space);
  if (spec.strategy.kind == "bayes") return make_bayes_strategy(spec, space);
  return std::make_unique<GridStrategy>(spec, space);
}

}  // namespace servetune::tuner
