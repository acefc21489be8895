// The slurm executor (see executor.h): one sbatch job per trial, recorded in jobs/<candidate>.<tag>.json so --resume
// waits for a job still pending or running instead of submitting it again; job states come from `scontrol`.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "servetune/error.h"
#include "tuner/executor.h"
#include "tuner/interrupt.h"
#include "tuner/progress.h"
#include "tuner/server_command.h"
#include "tuner/slurm.h"
#include "tuner/trial_runner.h"

namespace servetune::tuner {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kControllerPatienceS = 120.0;  // scontrol failing this long stops the sweep
constexpr double kCancelWaitS = 60.0;           // after scancel, how long the jobs get to end

fs::path job_file(const ResultsStore& store, const Trial& t) {
  return fs::path(store.dir()) / "jobs" / (t.candidate.id + "." + t.tag + ".json");
}

std::optional<std::string> recorded_job(const ResultsStore& store, const Trial& t) {
  const fs::path p = job_file(store, t);
  if (!fs::exists(p)) return std::nullopt;
  try {
    std::ifstream in(p);
    return nlohmann::json::parse(in).at("job_id").get<std::string>();
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kFormat, p.string() + ": not a job record: " + e.what());
  }
}

// Every job scontrol knows; nullopt when the controller does not answer.
std::optional<std::map<std::string, SlurmJobState>> query_jobs(std::string& error) {
  std::string out;
  if (run_command({"scontrol", "-o", "show", "job"}, out) != 0) {
    error = out;
    return std::nullopt;
  }
  return parse_scontrol_jobs(out);
}

bool on_path(const std::string& program) {
  std::string out;
  return run_command({"sh", "-c", "command -v " + shell_quote(program)}, out) == 0;
}

class SlurmExecutor final : public Executor {
 public:
  SlurmExecutor(const ExecutorOptions& o, const ExecutorContext& c) : o_(o), c_(c) {}

  size_t run(const std::vector<Trial>& trials) override {
    failed_ = 0;
    std::deque<Trial> queue;
    const auto known = must_query();
    for (const Trial& t : trials) {
      const auto id = recorded_job(c_.store, t);
      const auto it = id ? known.find(*id) : known.end();
      if (it != known.end() && !slurm_state_final(it->second.state)) {
        c_.progress.note(t.candidate.id + " (" + t.candidate.label + "): Slurm job " + *id + " from before is " +
                         it->second.state + "; waiting for it");
        jobs_.push_back({t, *id, Clock::now()});
      } else {
        queue.push_back(t);
      }
    }
    bool cancelled = false;
    Clock::time_point cancel_deadline{};
    Clock::time_point last_poll = Clock::now() - std::chrono::hours(1);
    Clock::time_point controller_ok = Clock::now();
    while (!queue.empty() || !jobs_.empty()) {
      if (!cancelled && (interrupted_by() != 0 || error_)) {
        cancelled = true;
        queue.clear();
        cancel_all();
        cancel_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kCancelWaitS));
      }
      while (!cancelled && !queue.empty() && (o_.parallel <= 0 || jobs_.size() < static_cast<size_t>(o_.parallel))) {
        submit(queue.front());
        queue.pop_front();
      }
      if (std::chrono::duration<double>(Clock::now() - last_poll).count() >= o_.poll_s || cancelled) {
        last_poll = Clock::now();
        std::string why;
        if (const auto states = query_jobs(why)) {
          controller_ok = Clock::now();
          reap(*states, cancelled);
        } else if (std::chrono::duration<double>(Clock::now() - controller_ok).count() > kControllerPatienceS) {
          if (!error_) error_ = "the Slurm controller has not answered for " + format_duration(kControllerPatienceS) + ": " + why;
          if (cancelled) abandon("the Slurm controller stopped answering");
        }
      }
      if (cancelled && Clock::now() > cancel_deadline) abandon("it did not end within " + format_duration(kCancelWaitS) + " of scancel");
      std::this_thread::sleep_for(std::chrono::milliseconds(cancelled ? 500 : 100));
    }
    if (error_) throw Error(ErrorKind::kInternal, *error_);
    return failed_;
  }

 private:
  struct Job {
    Trial trial;
    std::string id;
    Clock::time_point start;
  };

  std::map<std::string, SlurmJobState> must_query() {
    std::string why;
    auto states = query_jobs(why);
    if (!states) throw Error(ErrorKind::kIo, "--executor slurm: scontrol show job failed: " + why);
    return *states;
  }

  std::string log_rel(const Trial& t, const std::string& job_id) const {
    return (fs::path("raw") / t.candidate.id / ("slurm-" + t.tag + "-" + job_id + ".log")).string();
  }

  std::string script(const Trial& t) const {
    const nlohmann::ordered_json settings = c_.space.full_settings(t.candidate);
    std::string s = "#!/bin/sh\n";
    s += "#SBATCH --job-name=servetune-" + c_.spec.name + "-" + t.candidate.id + "." + t.tag + "\n";
    s += "#SBATCH --output=" + (fs::absolute(c_.store.raw_dir(t.candidate.id)) / ("slurm-" + t.tag + "-%j.log")).string() + "\n";
    s += "#SBATCH --chdir=" + fs::current_path().string() + "\n";
    s += "#SBATCH --ntasks=1\n";
    if (c_.spec.builtin()) {
      const auto threads = settings.find("threads");
      if (threads != settings.end() && threads->is_number_integer() && threads->get<int64_t>() > 0) {
        s += "#SBATCH --cpus-per-task=" + std::to_string(threads->get<int64_t>()) + "\n";
      }
    }
    if (c_.spec.target.devices) s += "#SBATCH --gres=gpu:" + std::to_string(std::max<int64_t>(1, c_.space.devices_needed(t.candidate))) + "\n";
    if (c_.spec.target.trial_timeout_s > 0) {  // the trial stops itself at its timeout; Slurm's limit is the backstop
      s += "#SBATCH --time=" + std::to_string(static_cast<int64_t>(std::ceil(c_.spec.target.trial_timeout_s * 1.2 / 60.0)) + 1) + "\n";
    }
    if (!o_.slurm_partition.empty()) s += "#SBATCH --partition=" + o_.slurm_partition + "\n";
    if (!o_.slurm_account.empty()) s += "#SBATCH --account=" + o_.slurm_account + "\n";
    std::string cmd;
    for (const auto& a : trial_command(c_.store.dir(), t)) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
    return s + "exec " + cmd + "\n";
  }

  void submit(const Trial& t) {
    const nlohmann::ordered_json settings = c_.space.full_settings(t.candidate);
    const auto nnodes = settings.find("nnodes");
    if (nnodes != settings.end() && nnodes->is_number_integer() && nnodes->get<int64_t>() > 1) {
      ++failed_;
      c_.runner.record_failure(t, TrialFailure::kDidNotStart,
                               "nnodes > 1: multi-node candidates do not run under --executor slurm yet (one job step per node is not "
                               "implemented)", "");
      return;
    }
    const fs::path jobs = fs::path(c_.store.dir()) / "jobs";
    fs::create_directories(jobs);
    fs::create_directories(c_.store.raw_dir(t.candidate.id));
    const fs::path path = jobs / (t.candidate.id + "." + t.tag + ".sbatch");
    write_file_atomic(path.string(), script(t));
    std::vector<std::string> argv = {"sbatch", "--parsable"};
    argv.insert(argv.end(), o_.sbatch_args.begin(), o_.sbatch_args.end());
    argv.push_back(path.string());
    std::string out;
    const int rc = run_command(argv, out);
    const std::string id = rc == 0 ? parse_sbatch_job_id(out) : "";
    if (id.empty()) {
      if (!error_) error_ = "sbatch did not accept trial " + trial_key(t) + " (" + path.string() + "): " + out;
      return;
    }
    nlohmann::ordered_json j;
    j["executor"] = "slurm";
    j["job_id"] = id;
    j["trial"] = trial_key(t);
    j["script"] = fs::relative(path, c_.store.dir()).string();
    j["log"] = log_rel(t, id);
    j["submitted"] = now_iso8601();
    write_file_atomic(job_file(c_.store, t).string(), j.dump(2) + "\n");
    c_.progress.note(t.candidate.id + " (" + t.candidate.label + "): Slurm job " + id + " (log " + log_rel(t, id) + ")");
    jobs_.push_back({t, id, Clock::now()});
  }

  void reap(const std::map<std::string, SlurmJobState>& states, bool cancelled) {
    for (size_t i = 0; i < jobs_.size();) {
      const auto it = states.find(jobs_[i].id);
      const std::optional<SlurmJobState> state = it == states.end() ? std::nullopt : std::optional<SlurmJobState>(it->second);
      if (state && !slurm_state_final(state->state)) {
        ++i;
        continue;
      }
      const Job job = jobs_[i];
      jobs_.erase(jobs_.begin() + static_cast<long>(i));
      finish(job, state, cancelled);
    }
  }

  void finish(const Job& job, const std::optional<SlurmJobState>& state, bool cancelled) {
    const Trial& t = job.trial;
    const double seconds = std::chrono::duration<double>(Clock::now() - job.start).count();
    if (const auto failed = trial_ended(c_, t, "Slurm job " + job.id + " ", seconds)) {
      failed_ += *failed ? 1 : 0;
      return;
    }
    ++failed_;
    auto [kind, why] = classify_slurm_end(job.id, state);
    if (cancelled && interrupted_by() != 0) {
      kind = TrialFailure::kInterrupted;
      why = interruption_reason() + " (Slurm job " + job.id + " cancelled)";
    }
    c_.runner.record_failure(t, kind, why, log_rel(t, job.id));
  }

  void cancel_all() {
    if (jobs_.empty()) return;
    std::vector<std::string> argv = {"scancel"};
    for (const auto& j : jobs_) argv.push_back(j.id);
    std::string out;
    if (run_command(argv, out) != 0) c_.progress.note("scancel: " + out);
  }

  // Jobs that did not end after scancel: their trials count as interrupted (--resume looks at the job again).
  void abandon(const std::string& why) {
    for (const auto& j : jobs_) {
      ++failed_;
      c_.runner.record_failure(j.trial, TrialFailure::kInterrupted, "Slurm job " + j.id + ": " + why, log_rel(j.trial, j.id));
    }
    jobs_.clear();
  }

  ExecutorOptions o_;
  ExecutorContext c_;
  std::vector<Job> jobs_;
  size_t failed_ = 0;
  std::optional<std::string> error_;
};

}  // namespace

void refuse_live_slurm_jobs(const ResultsStore& store, const std::vector<Trial>& trials) {
  std::vector<std::pair<std::string, std::string>> recorded;  // (trial, job id)
  for (const Trial& t : trials) {
    if (auto id = recorded_job(store, t)) recorded.emplace_back(trial_key(t), *id);
  }
  if (recorded.empty() || !on_path("scontrol")) return;
  std::string why;
  const auto states = query_jobs(why);
  if (!states) return;
  for (const auto& [trial, id] : recorded) {
    const auto it = states->find(id);
    if (it != states->end() && !slurm_state_final(it->second.state)) {
      throw_usage("trial " + trial + " of " + store.dir() + " is Slurm job " + id + ", still " + it->second.state +
                  ": resume with --executor slurm (it waits for the job) or scancel " + id + " first");
    }
  }
}

void check_slurm_executor(const ExecutorOptions& o) {
  if (!(o.poll_s > 0)) throw_usage("--slurm-poll must be positive");
  for (const char* p : {"sbatch", "scontrol", "scancel"}) {
    if (!on_path(p)) throw_usage(std::string("--executor slurm: ") + p + " is not on PATH (run the sweep on a Slurm submit host)");
  }
  std::string why;
  if (!query_jobs(why)) throw Error(ErrorKind::kIo, "--executor slurm: the Slurm controller does not answer (scontrol -o show job): " + why);
}

std::unique_ptr<Executor> make_slurm_executor(const ExecutorOptions& o, const ExecutorContext& c) {
  return std::make_unique<SlurmExecutor>(o, c);
}

}  // namespace servetune::tuner
