// Sweeps through a real one-node Slurm cluster (slurm_cluster.h): every trial an sbatch job that writes its records;
// the driver killed with jobs in flight and one job cancelled mid-run, then --resume: it waits for the jobs still
// there (no second submission), runs the cancelled trial again, and every candidate ends with exactly one set of
// records; a local resume is refused while a trial's job still runs; Ctrl-C cancels the jobs.
#include <signal.h>

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "slurm_cluster.h"
#include "test_paths.h"
#include "tuner_cli.h"

namespace servetune::testing {
namespace {
namespace fs = std::filesystem;

class TunerSlurm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string why = SlurmCluster::why_not();
    if (!why.empty()) {
      skip_ = why;
      return;
    }
    cluster_ = new SlurmCluster();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) {
      if (std::getenv("SERVETUNE_REQUIRE_SLURM") != nullptr) FAIL() << "SERVETUNE_REQUIRE_SLURM is set but " << skip_;
      GTEST_SKIP() << skip_;
    }
    ASSERT_TRUE(cluster_->started()) << cluster_->logs();
  }

  static inline SlurmCluster* cluster_ = nullptr;
  static inline std::string skip_;
};

std::string sweep_file(const std::string& name, const std::string& workload) {
  return "name: " + name + "\ntarget: {engine: builtin, model: " + stories_path() +
         ", settings: {threads: 1}}\nspace:\n  max_running_requests: [1, 2, 4, 8]\nworkloads:\n" + workload + "repeat: 1\n";
}

std::map<std::string, std::string> job_ids(const fs::path& run) {
  std::map<std::string, std::string> ids;
  if (!fs::exists(run / "jobs")) return ids;
  for (const auto& e : fs::directory_iterator(run / "jobs")) {
    if (is_finished_json(e)) ids[e.path().stem().string()] = read_json(e.path())["job_id"];
  }
  return ids;
}

std::string job_state(const std::string& id) {
  FILE* p = popen(("scontrol -o show job " + id + " 2>/dev/null").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  const size_t at = out.find("JobState=");
  return at == std::string::npos ? "" : out.substr(at + 9, out.find(' ', at) - at - 9);
}

// Starts a sweep of four ~5 s trials (24 requests at 5/s; two jobs at a time on two CPUs) through Slurm, and returns
// once every trial is submitted and one job runs (its trial and job id), or at a 90 s deadline (empty id).
struct SlowSweep {
  pid_t pid = -1;
  std::string running_trial, running_id;
};
SlowSweep start_slow_sweep(const fs::path& dir, const fs::path& run) {
  write_text(dir / "s.yaml", sweep_file("slow", "  - {name: w, dataset: random, input_len: 16, output_len: 8, num_prompts: 24, "
                                                "request_rate: 5, seed: 3}\n"));
  SlowSweep s;
  s.pid = spawn_servetune("sweep", (dir / "s.yaml").string(), "--output", run.string(), "--executor", "slurm", "--slurm-poll", "0.3");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (s.running_id.empty() && std::chrono::steady_clock::now() < deadline) {
    const auto ids = job_ids(run);
    if (ids.size() == 4) {
      for (const auto& [trial, id] : ids) {
        if (s.running_id.empty() && job_state(id) == "RUNNING") s.running_trial = trial, s.running_id = id;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return s;
}

// One record per candidate, each from the launch its marker names.
void expect_each_candidate_once(const fs::path& run, size_t candidates) {
  std::map<std::string, std::string> launch;
  for (const auto& e : fs::directory_iterator(run / "trials")) {
    if (!is_finished_json(e)) continue;
    const auto m = read_json(e.path());
    EXPECT_EQ(m["status"], "ok") << m.dump();
    launch[m["candidate"]] = m["launch_id"];
  }
  EXPECT_EQ(launch.size(), candidates);
  size_t records = 0;
  for (const auto& e : fs::recursive_directory_iterator(run / "records")) {
    if (!is_finished_json(e)) continue;
    ++records;
    const auto rec = read_json(e.path());
    EXPECT_EQ(rec["provenance"]["launch_id"], launch[rec["candidate"]["id"]]) << e.path();
  }
  EXPECT_EQ(records, candidates);
}

TEST_F(TunerSlurm, EveryTrialRunsAsAJob) {
  const fs::path dir = scratch("slurm_grid");
  write_text(dir / "s.yaml", sweep_file("sgrid", "  - {name: w, dataset: random, input_len: 32, output_len: 16, num_prompts: 16, seed: 3}\n"));
  const fs::path run = dir / "run";
  const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string() + " --executor slurm --slurm-poll 0.3");
  ASSERT_EQ(r.code, 0) << r.output << cluster_->logs();
  EXPECT_NE(r.output.find("4 trials run, 0 reused, 0 candidates skipped, 0 failed"), std::string::npos) << r.output;
  const auto ids = job_ids(run);
  ASSERT_EQ(ids.size(), 4u);
  for (const auto& [trial, id] : ids) {
    const std::string cand = trial.substr(0, trial.find('.'));
    EXPECT_TRUE(fs::exists(run / "raw" / cand / ("slurm-main-" + id + ".log"))) << trial;  // the job wrote it
    EXPECT_NE(read_text(run / "jobs" / (trial + ".sbatch")).find("--trial " + cand + ":main"), std::string::npos);
  }
  expect_each_candidate_once(run, 4);
  EXPECT_TRUE(fs::exists(run / "report.md"));
  fs::remove_all(dir);
}

TEST_F(TunerSlurm, KilledDriverAndCancelledJobResumeWithoutLossOrDuplicates) {
  const fs::path dir = scratch("slurm_resume");
  const fs::path run = dir / "run";
  // Once every trial is submitted and one job runs: kill the driver, cancel that job.
  const SlowSweep sweep = start_slow_sweep(dir, run);
  ASSERT_GE(sweep.pid, 0);
  const pid_t pid = sweep.pid;
  const std::string running_trial = sweep.running_trial, running_id = sweep.running_id;
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_FALSE(running_id.empty()) << "no job was seen running" << cluster_->logs();
  ASSERT_TRUE(WIFSIGNALED(status)) << "the sweep finished before it could be killed";
  const auto before = job_ids(run);

  // A local resume would run the trials whose jobs are still there a second time: refused.
  const CliResult local = servetune("sweep --resume " + run.string());
  EXPECT_EQ(local.code, 2) << local.output;
  EXPECT_NE(local.output.find("resume with --executor slurm"), std::string::npos) << local.output;

  ASSERT_TRUE(servetune_shell("scancel " + running_id));
  const auto cancel_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (job_state(running_id) != "CANCELLED" && std::chrono::steady_clock::now() < cancel_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(job_state(running_id), "CANCELLED");
  const CliResult r = servetune("sweep --resume " + run.string() + " --executor slurm --slurm-poll 0.3");
  ASSERT_EQ(r.code, 0) << r.output << cluster_->logs();
  const auto after = job_ids(run);
  ASSERT_EQ(after.size(), 4u);
  size_t waited = 0, resubmitted = 0;
  for (const auto& [trial, id] : before) {
    if (trial == running_trial) {
      EXPECT_NE(after.at(trial), id) << "the cancelled job's trial runs again as a new job";
      ++resubmitted;
    } else if (after.at(trial) == id) {
      ++waited;
    }
  }
  EXPECT_EQ(resubmitted, 1u);
  // The jobs still pending or running when the driver died are waited for, not submitted again (a job that had
  // finished meanwhile is reused through its marker: it keeps its id too).
  EXPECT_EQ(waited, 3u) << r.output;
  EXPECT_NE(r.output.find("; waiting for it"), std::string::npos) << r.output;
  expect_each_candidate_once(run, 4);
  fs::remove_all(dir);
}

// Ctrl-C (SIGINT) to the driver cancels the sweep's jobs: every trial not finished is recorded as interrupted, no job
// is left in the queue, and the exit status is the signal's.
TEST_F(TunerSlurm, InterruptCancelsTheJobs) {
  const fs::path dir = scratch("slurm_interrupt");
  const fs::path run = dir / "run";
  const SlowSweep sweep = start_slow_sweep(dir, run);
  ASSERT_GE(sweep.pid, 0);
  const pid_t pid = sweep.pid;
  ASSERT_FALSE(sweep.running_id.empty()) << cluster_->logs();
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
  size_t interrupted = 0;
  for (const auto& e : fs::directory_iterator(run / "trials")) {
    if (is_finished_json(e)) interrupted += read_json(e.path())["failure"] == "interrupted" ? 1 : 0;
  }
  EXPECT_EQ(interrupted, 4u);
  for (const auto& [trial, id] : job_ids(run)) {
    const std::string state = job_state(id);
    EXPECT_TRUE(state == "CANCELLED" || state == "COMPLETED" || state.empty()) << trial << " is " << state;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace servetune::testing
