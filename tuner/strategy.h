// Search strategies. Each produces batches of trials (a candidate launched once and measured on a list of
// workloads) and decides what comes next from the results so far, deterministically: replaying a strategy over
// stored results yields the same batches, which is what --resume and `servetune report` rely on.
//   grid     every candidate on every workload
//   staged   stages of dimensions (engine, parallelism, compile, speculative ...): each stage varies its dimensions
//            around the incumbent and keeps the winner (the method of published tuning studies)
//   halving  successive halving: every candidate on short screening runs of the objective workload, the best
//            fraction of each rung goes on, the survivors (and the baseline) run every workload
//   bayes    model-guided (TPE, strategy_bayes.h): random candidates first, then one at a time where the results so
//            far say the good ones are, within a budget of candidates
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tuner/results_table.h"
#include "tuner/space.h"
#include "tuner/sweep_spec.h"

namespace servetune::tuner {

struct Trial {
  Candidate candidate;
  std::string tag;                     // "main", or "screen<N>" for a halving rung
  std::vector<WorkloadSpec> workloads;
};

struct Batch {
  std::string stage;
  std::vector<Trial> trials;
};

// What the report shows per stage: who competed, who led before, who won.
struct StageSummary {
  std::string name;
  std::vector<std::string> dims;        // staged: the stage's dimensions
  std::string workload;                 // the workload the stage was decided on
  std::vector<std::string> candidates;  // ids measured in the stage
  std::string incumbent;                // the leader before the stage (staged: its starting point)
  std::string winner;                   // empty until decided
  size_t kept = 0;                      // halving: candidates passed on
  std::string not_promoted;             // staged: the stage's best challenger, kept out because its lead was within noise
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  static std::unique_ptr<Strategy> make(const SweepSpec& spec, const SearchSpace& space);

  // The next batch given the results so far; nullopt when the search is over.
  virtual std::optional<Batch> next(const ResultsTable& results) = 0;
  // (candidate, workload, repeat) runs expected in total, for the ETA (an upper bound for staged).
  virtual size_t planned_runs() const = 0;
  const std::vector<StageSummary>& stages() const { return stages_; }

 protected:
  std::vector<StageSummary> stages_;
};

// The goal a sweep optimises (objective + SLO).
Goal goal_of(const SweepSpec& spec);

}  // namespace servetune::tuner
