// Executors: where a sweep's trials run. The strategy hands over one batch at a time (trials that do not depend on
// each other); the executor runs them to their completion markers and returns.
//   local          one trial at a time (TrialRunner::run: a built-in candidate in a forked child)
//   local, --parallel K
//                  up to K trials at once, each a `servetune sweep --resume RUN --trial ID:TAG` process pinned to its
//                  share of this process's CPUs and, with target.devices, given its own devices (CUDA_VISIBLE_DEVICES)
//   slurm          each trial an sbatch job running that same command (the run folder on storage the nodes share);
//                  the driver polls `scontrol`, classifies jobs that died without a result, and Ctrl-C cancels them
// A trial process that dies without writing its marker gets one written by the executor, so no trial is lost.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tuner/results_store.h"
#include "tuner/space.h"
#include "tuner/strategy.h"
#include "tuner/sweep_spec.h"

namespace servetune::tuner {

class Progress;
class TrialRunner;

struct ExecutorOptions {
  std::string kind = "local";  // local | slurm
  int parallel = 0;            // local: trials at once (0, 1: one); slurm: jobs in flight at once (0: a whole batch)
  std::string slurm_partition;
  std::string slurm_account;
  std::vector<std::string> sbatch_args;  // extra sbatch options, e.g. "--constraint=h200"
  double poll_s = 5.0;                   // slurm: seconds between scontrol polls
};

struct ExecutorContext {
  const SweepSpec& spec;
  const SearchSpace& space;
  ResultsStore& store;
  TrialRunner& runner;
  Progress& progress;
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Checks the options against the sweep and the machine before anything is created or run: Error(kUsage) naming what
  // does not fit, Error(kIo) when Slurm does not answer.
  static void check(const ExecutorOptions& options, const SweepSpec& spec);
  // An executor for options that passed check() (run_sweep checks them before the run folder exists).
  static std::unique_ptr<Executor> make(const ExecutorOptions& options, const ExecutorContext& context);
  // Runs the trials to their markers; returns how many failed. Stops starting trials once the sweep is interrupted.
  virtual size_t run(const std::vector<Trial>& trials) = 0;
};

// "c03:main": how --trial names a trial.
std::string trial_key(const Trial& t);
// The command a trial's own process runs (an absolute path to this program, the run folder made absolute).
std::vector<std::string> trial_command(const std::string& run_dir, const Trial& t);
// A trial whose own process or job has ended: counts its runs for the ETA and, when the trial wrote its marker, notes
// how it ended ("<candidate> (<label>): <who>done in 3s", or failed with its failure and reason). nullopt when there is
// no marker (the executor records the failure), else whether the trial failed.
std::optional<bool> trial_ended(const ExecutorContext& c, const Trial& t, const std::string& who, double seconds);
// The log a trial's own process writes (raw/<candidate>/trial-<tag>.log).
std::string trial_log_path(const ResultsStore& store, const Trial& t);

// Before a local executor runs trials of a run folder: Error(kUsage) when one of them has a Slurm job (jobs/) that
// is still pending or running, which would run the trial twice.
void refuse_live_slurm_jobs(const ResultsStore& store, const std::vector<Trial>& trials);

void check_local_executor(const ExecutorOptions& options, const SweepSpec& spec);
void check_slurm_executor(const ExecutorOptions& options);
std::unique_ptr<Executor> make_local_executor(const ExecutorOptions& options, const ExecutorContext& context);
std::unique_ptr<Executor> make_slurm_executor(const ExecutorOptions& options, const ExecutorContext& context);

}  // namespace servetune::tuner
