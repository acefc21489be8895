// One trial of a sweep: launch the candidate once, measure its workloads x repeats (measurement.h), write one
// record per run and the trial's completion marker (written last: a trial without one is re-run on --resume), and
// tear the candidate down. A failed candidate gets a marker naming its TrialFailure; the sweep goes on.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "datasets/dataset.h"
#include "tuner/launcher.h"
#include "tuner/measurement.h"
#include "tuner/progress.h"
#include "tuner/results_store.h"
#include "tuner/space.h"
#include "tuner/strategy.h"
#include "tuner/sweep_spec.h"

namespace servetune {
class Tokenizer;
}  // namespace servetune

namespace servetune::tuner {

enum class TrialStatus { kOk, kFailed, kSkipped };

// A trial's completion marker (trials/ in the run folder); empty strings are written as "".
struct TrialMarker {
  TrialStatus status = TrialStatus::kOk;
  TrialFailure failure = TrialFailure::kNone;
  std::string reason;     // why it failed or was skipped
  std::string launch_id;  // the launch that wrote the trial's records
  std::string log;        // the server log, relative to the run folder
  std::string command;    // the launch command (external)
  std::string started;    // ISO 8601
};

class TrialRunner {
 public:
  // `tokenizer` builds the workloads' prompts (the target's tokenizer).
  TrialRunner(const SweepSpec& spec, const SearchSpace& space, ResultsStore& store, Launcher& launcher,
              Progress& progress, const Tokenizer& tokenizer);

  // Runs the trial (a built-in candidate in a child process); false when the candidate failed.
  bool run(const Trial& t);
  // Records a candidate the constraints skipped.
  void skip(const Trial& t);
  // Records the failure of a trial whose own process or job ended without writing its marker (an executor's child,
  // a Slurm job); `log` relative to the run folder.
  void record_failure(const Trial& t, TrialFailure kind, const std::string& reason, const std::string& log);

 private:
  bool run_isolated(const Trial& t);
  bool run_here(const Trial& t);
  void write_marker(const Trial& t, const TrialMarker& marker);
  void check_failed_requests(const Measurement& m, const std::string& workload) const;
  bool precise_enough(const nlohmann::ordered_json& metrics, std::vector<double>& samples) const;
  Measurement run_once(const WorkloadSpec& level, const WorkloadSpec& prompts, int r, Session& session,
                       const nlohmann::ordered_json& info, const Trial& t, const TrialMarker& marker,
                       nlohmann::ordered_json& metrics);
  void search_load(const WorkloadSpec& w, Session& session, const nlohmann::ordered_json& info, const Trial& t,
                   const TrialMarker& marker, size_t& done);
  void write_record(const nlohmann::ordered_json& info, const WorkloadSpec& w, int repeat,
                    const nlohmann::ordered_json& metrics, const nlohmann::ordered_json& per_request,
                    const std::string& tag, const std::string& launch_id, const Engine* engine);
  nlohmann::ordered_json candidate_info(const Candidate& c) const;
  const datasets::Workload& workload(const WorkloadSpec& w);
  void load_workloads(const Trial& t);

  const SweepSpec& spec_;
  const SearchSpace& space_;
  ResultsStore& store_;
  Launcher& launcher_;
  Progress& progress_;
  const Tokenizer& tokenizer_;
  nlohmann::ordered_json environment_;
  std::map<std::string, datasets::Workload> workloads_;
  nlohmann::ordered_json accuracy_;  // the candidate's accuracy metrics (accuracy.h), in each of its records
};

}  // namespace servetune::tuner
