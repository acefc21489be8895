// The executor choice and what the executors share: how a trial's own process is named, started and logged
// (see executor.h).
#include "tuner/executor.h"

#include <unistd.h>

#include <filesystem>

#include "servetune/error.h"
#include "tuner/progress.h"

namespace servetune::tuner {
namespace fs = std::filesystem;

void Executor::check(const ExecutorOptions& o, const SweepSpec& spec) {
  if (o.parallel < 0) throw_usage("--parallel must not be negative (local: 1 = one trial at a time; slurm: 0 = a whole batch at once)");
  if (o.kind == "local") {
    if (!o.slurm_partition.empty() || !o.slurm_account.empty() || !o.sbatch_args.empty()) {
      throw_usage("--slurm-partition, --slurm-account and --sbatch-arg need --executor slurm");
    }
    check_local_executor(o, spec);
  } else if (o.kind == "slurm") {
    check_slurm_executor(o);
  } else {
    throw_usage("--executor must be local or slurm, got '" + o.kind + "'");
  }
}

std::unique_ptr<Executor> Executor::make(const ExecutorOptions& o, const ExecutorContext& c) {
  return o.kind == "slurm" ? make_slurm_executor(o, c) : make_local_executor(o, c);
}

std::string trial_key(const Trial& t) { return t.candidate.id + ":" + t.tag; }

std::vector<std::string> trial_command(const std::string& run_dir, const Trial& t) {
  std::error_code ec;
  std::string exe = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw Error(ErrorKind::kIo, "cannot find this program's path (/proc/self/exe): " + ec.message());
  return {exe, "sweep", "--resume", fs::absolute(run_dir).lexically_normal().string(), "--trial", trial_key(t)};
}

std::optional<bool> trial_ended(const ExecutorContext& c, const Trial& t, const std::string& who, double seconds) {
  c.progress.child_done(max_runs(t.workloads, c.spec.repeat), seconds);
  const auto marker = c.store.trial(t.candidate.id, t.tag);
  if (!marker) return std::nullopt;
  const std::string status = marker->value("status", std::string());
  c.progress.note(t.candidate.id + " (" + t.candidate.label + "): " + who +
                  (status == "ok" ? std::string("done")
                                  : status + " (" + marker->value("failure", std::string()) + "): " + marker->value("reason", std::string())) +
                  " in " + format_duration(seconds));
  return status != "ok";
}

std::string trial_log_path(const ResultsStore& store, const Trial& t) {
  return (fs::path(store.raw_dir(t.candidate.id)) / ("trial-" + t.tag + ".log")).string();
}

}  // namespace servetune::tuner
