// The Slurm commands the slurm executor uses (sbatch, scontrol, scancel) and what their answers mean: job states
// read with `scontrol -o show job` (clusters without accounting storage have no sacct), classified into a trial's
// failure when a job ended without writing its trial's result.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tuner/launcher.h"

namespace servetune::tuner {

struct SlurmJobState {
  std::string state;      // JobState: PENDING, RUNNING, COMPLETED, TIMEOUT, NODE_FAIL, ...
  std::string reason;     // Reason
  std::string exit_code;  // ExitCode "0:0" (status:signal)
};

// Runs `argv` (argv[0] looked up on PATH) and returns its exit status (-1: it could not be started, or died by a
// signal); stdout and stderr together into `output`.
int run_command(const std::vector<std::string>& argv, std::string& output);

// Parses `scontrol -o show job` output: one line per job ("JobId=12 JobName=... JobState=RUNNING Reason=None ...").
std::map<std::string, SlurmJobState> parse_scontrol_jobs(const std::string& text);

// Whether a job in this state is over (it will not run, or run again without someone acting).
bool slurm_state_final(const std::string& state);

// A trial whose job ended in `state` without writing its result: the failure to record and why. Slurm's own
// failures (node failure, preemption, a cancel from outside the sweep) are kInterrupted, so --resume runs the trial
// again; the candidate's (time limit, out of memory, a crash) are recorded as such.
std::pair<TrialFailure, std::string> classify_slurm_end(const std::string& job_id, const std::optional<SlurmJobState>& state);

// sbatch's --parsable answer ("12" or "12;cluster") -> the job id, or "" when it is not one.
std::string parse_sbatch_job_id(const std::string& output);

}  // namespace servetune::tuner
