// `servetune sweep`: validates the sweep file and everything it names before anything runs, then drives the
// strategy: each trial launches its candidate once, runs its workloads x repeats, writes one record per run and a
// completion marker, and tears the candidate down. --resume replays the strategy over the stored results and runs
// only the trials without a marker. `servetune sweep` then writes the reports (report/report.h).
#pragma once

#include <cstdio>
#include <string>

#include "tuner/executor.h"
#include "tuner/sweep_spec.h"

namespace servetune::tuner {

struct SweepOptions {
  std::string file;        // sweep file (optional with --resume)
  std::string output_dir;  // --output
  std::string resume_dir;  // --resume
  bool dry_run = false;
  ExecutorOptions executor;  // --executor, --parallel, --slurm-*
  // --trial ID[:TAG] (with --resume): run only this trial of the run folder, in this process, and write its records
  // and marker: what an executor's trial process runs. Its exit status: 0 ok, 3 the candidate failed.
  std::string trial;
  std::FILE* out = stdout;       // plan and summary
  std::FILE* progress = stderr;  // progress lines
};

struct SweepOutcome {
  std::string run_dir;
  size_t trials_run = 0;
  size_t trials_reused = 0;
  size_t skipped = 0;
  size_t failed = 0;
  size_t succeeded = 0;    // candidates whose trial completed (ok), this run and reused
  int interrupted_by = 0;  // the signal that stopped the sweep early, or 0
  bool trial_failed = false;  // --trial: the trial's marker says it failed
};

SweepOutcome run_sweep(const SweepOptions& options);

// The resolved plan (`--dry-run`, and plan.txt in the run folder): target, space, constraints and skipped
// candidates, strategy, workloads, goal.
void print_plan(std::FILE* out, const SweepSpec& spec);
std::string plan_text(const SweepSpec& spec);

}  // namespace servetune::tuner
