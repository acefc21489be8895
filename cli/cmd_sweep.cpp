// `servetune sweep FILE [--output RUN_DIR] [--resume RUN_DIR] [--dry-run]`: the tuner (see tuner/sweep_runner.h).
#include <cstdlib>
#include <string>

#include "commands.h"
#include "report/report.h"
#include "servetune/error.h"
#include "tuner/interrupt.h"
#include "tuner/sweep_runner.h"

namespace servetune::cli {
namespace {

void add_sweep_command(CLI::App& app) {
  auto o = std::make_shared<tuner::SweepOptions>();
  CLI::App* cmd = app.add_subcommand("sweep", "Tune engine settings: run a sweep file's candidates x workloads, record results, write a report");
  cmd->add_option("file", o->file, "Sweep file (YAML or JSON); optional with --resume");
  cmd->add_option("--output,-o", o->output_dir, "Run folder (default: results/<name>/<timestamp>)");
  cmd->add_option("--resume", o->resume_dir, "Continue the sweep in this run folder: runs only what is not complete");
  cmd->add_flag("--dry-run", o->dry_run, "Validate the sweep file and print the resolved plan; run nothing");
  cmd->add_option("--executor", o->executor.kind, "Where trials run: local (this machine) or slurm (an sbatch job per trial)")
      ->check(CLI::IsMember({"local", "slurm"}));
  cmd->add_option("--parallel", o->executor.parallel,
                  "local: trials at once, each on its share of the CPUs (and of target.devices); slurm: jobs in flight "
                  "(default: a whole batch)");
  cmd->add_option("--slurm-partition", o->executor.slurm_partition, "slurm: the partition the jobs go to");
  cmd->add_option("--slurm-account", o->executor.slurm_account, "slurm: the account the jobs are charged to");
  cmd->add_option("--sbatch-arg", o->executor.sbatch_args, "slurm: an extra sbatch option (repeatable), e.g. --sbatch-arg=--constraint=h200")
      ->allow_extra_args(false);
  cmd->add_option("--slurm-poll", o->executor.poll_s, "slurm: seconds between job-state polls (scontrol)");
  cmd->add_option("--trial", o->trial,
                  "With --resume: run only this trial (CANDIDATE[:TAG], e.g. c03:main) in this process: what the "
                  "executors' trial processes and Slurm jobs run");
  cmd->callback([o] {
    const tuner::SweepOutcome outcome = tuner::run_sweep(*o);
    if (o->dry_run) return;
    if (!o->trial.empty()) {  // a trial process: its executor reads the marker; the report is the driver's
      std::fflush(nullptr);
      if (outcome.interrupted_by != 0) std::exit(128 + outcome.interrupted_by);
      if (outcome.trial_failed) std::exit(3);
      return;
    }
    report::write_reports(outcome.run_dir);
    std::fprintf(o->out, "%zu trials run, %zu reused, %zu candidates skipped, %zu failed. Report: %s/report.md\n",
                 outcome.trials_run, outcome.trials_reused, outcome.skipped, outcome.failed, outcome.run_dir.c_str());
    if (outcome.interrupted_by != 0) {
      std::string resume = "servetune sweep --resume " + outcome.run_dir;
      if (o->executor.kind != "local") resume += " --executor " + o->executor.kind;
      if (o->executor.parallel > 1) resume += " --parallel " + std::to_string(o->executor.parallel);
      std::fprintf(o->out, "Interrupted by %s: the report covers what finished; go on with: %s\n",
                   tuner::signal_name(outcome.interrupted_by), resume.c_str());
      std::fflush(nullptr);
      std::exit(128 + outcome.interrupted_by);  // as a shell reports a process the signal ended
    }
    if (outcome.succeeded == 0) {
      throw servetune::Error(servetune::ErrorKind::kInternal, "no candidate completed its trial; " + outcome.run_dir +
                                            "/report.md lists each one and why it failed or was skipped");
    }
  });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(50, add_sweep_command);

}  // namespace servetune::cli
