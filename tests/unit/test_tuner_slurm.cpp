// The slurm executor's reading of Slurm: `scontrol -o show job` lines, sbatch --parsable answers, and which end
// states are the candidate's failure and which are Slurm's (run again by --resume).
#include <gtest/gtest.h>

#include "tuner/slurm.h"

namespace servetune::tuner {
namespace {

TEST(TunerSlurm, ParsesOneLinePerJob) {
  const std::string text =
      "JobId=12 JobName=servetune-x-c0.main UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) ExitCode=0:0 RunTime=00:00:03\n"
      "JobId=13 JobName=servetune-x-c1.main JobState=PENDING Reason=Resources ExitCode=0:0\n"
      "JobId=9 JobName=old JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15\n"
      "No jobs in the system\n";
  const auto jobs = parse_scontrol_jobs(text);
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs.at("12").state, "RUNNING");
  EXPECT_EQ(jobs.at("13").reason, "Resources");
  EXPECT_EQ(jobs.at("9").exit_code, "0:15");
  EXPECT_TRUE(parse_scontrol_jobs("No jobs in the system\n").empty());
}

TEST(TunerSlurm, FinalStates) {
  for (const char* s : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL"}) {
    EXPECT_TRUE(slurm_state_final(s)) << s;
  }
  for (const char* s : {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"}) {
    EXPECT_FALSE(slurm_state_final(s)) << s;
  }
}

TEST(TunerSlurm, EndsWithoutAResultAreClassified) {
  const auto kind = [](const char* state) { return classify_slurm_end("7", SlurmJobState{state, "None", "0:9"}).first; };
  EXPECT_EQ(kind("TIMEOUT"), TrialFailure::kTimedOut);
  EXPECT_EQ(kind("OUT_OF_MEMORY"), TrialFailure::kOom);
  EXPECT_EQ(kind("NODE_FAIL"), TrialFailure::kInterrupted);  // not the candidate's doing: --resume runs it again
  EXPECT_EQ(kind("PREEMPTED"), TrialFailure::kInterrupted);
  EXPECT_EQ(kind("CANCELLED"), TrialFailure::kInterrupted);
  EXPECT_EQ(kind("FAILED"), TrialFailure::kCrashed);
  const auto [unknown, why] = classify_slurm_end("7", std::nullopt);
  EXPECT_EQ(unknown, TrialFailure::kCrashed);
  EXPECT_NE(why.find("no longer known to Slurm"), std::string::npos) << why;
  EXPECT_NE(classify_slurm_end("7", SlurmJobState{"FAILED", "NonZeroExitCode", "1:0"}).second.find("exit code 1:0"), std::string::npos);
}

TEST(TunerSlurm, SbatchParsableAnswer) {
  EXPECT_EQ(parse_sbatch_job_id("12\n"), "12");
  EXPECT_EQ(parse_sbatch_job_id("345;cluster\n"), "345");
  EXPECT_EQ(parse_sbatch_job_id("sbatch: error: invalid partition specified: gpu\n"), "");
  EXPECT_EQ(parse_sbatch_job_id(""), "");
}

TEST(TunerSlurm, RunCommandCapturesOutputAndStatus) {
  std::string out;
  EXPECT_EQ(run_command({"sh", "-c", "echo out; echo err >&2; exit 3"}, out), 3);
  EXPECT_EQ(out, "out\nerr\n");
  EXPECT_EQ(run_command({"/nonexistent/program"}, out), 127);
  EXPECT_NE(out.find("cannot run"), std::string::npos) << out;
}

}  // namespace
}  // namespace servetune::tuner
