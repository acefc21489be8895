// Slurm commands and their answers (see slurm.h).
#include "tuner/slurm.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

namespace servetune::tuner {

int run_command(const std::vector<std::string>& argv, std::string& output) {
  output.clear();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execvp(args[0], args.data());
    const std::string msg = argv[0] + ": cannot run: " + std::strerror(errno) + "\n";
    (void)!::write(STDERR_FILENO, msg.data(), msg.size());
    ::_exit(127);
  }
  ::close(fds[1]);
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) {
      output.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::map<std::string, SlurmJobState> parse_scontrol_jobs(const std::string& text) {
  std::map<std::string, SlurmJobState> jobs;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string field, id;
    SlurmJobState s;
    while (fields >> field) {
      const size_t eq = field.find('=');
      if (eq == std::string::npos) continue;
      const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
      if (key == "JobId") id = value;
      if (key == "JobState") s.state = value;
      if (key == "Reason") s.reason = value;
      if (key == "ExitCode") s.exit_code = value;
    }
    if (!id.empty() && !s.state.empty()) jobs[id] = s;
  }
  return jobs;
}

bool slurm_state_final(const std::string& state) {
  static const std::set<std::string> kFinal = {"COMPLETED", "FAILED",        "CANCELLED", "TIMEOUT",  "NODE_FAIL",
                                               "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"};
  return kFinal.count(state) != 0;
}

std::pair<TrialFailure, std::string> classify_slurm_end(const std::string& job_id, const std::optional<SlurmJobState>& s) {
  const std::string job = "Slurm job " + job_id;
  if (!s) {
    return {TrialFailure::kCrashed, job + " is no longer known to Slurm and wrote no result (it ended more than "
                                          "MinJobAge ago, or was purged)"};
  }
  const std::string how = job + " ended " + s->state + (s->reason.empty() || s->reason == "None" ? "" : " (" + s->reason + ")");
  if (s->state == "TIMEOUT" || s->state == "DEADLINE") return {TrialFailure::kTimedOut, how + ": it ran past its time limit"};
  if (s->state == "OUT_OF_MEMORY") return {TrialFailure::kOom, how + ": Slurm's memory limit for the job was exceeded"};
  if (s->state == "NODE_FAIL" || s->state == "BOOT_FAIL" || s->state == "PREEMPTED" || s->state == "CANCELLED") {
    return {TrialFailure::kInterrupted, how + ", not through the candidate: --resume runs it again"};
  }
  return {TrialFailure::kCrashed, how + " with exit code " + s->exit_code + " without writing the trial's result"};
}

std::string parse_sbatch_job_id(const std::string& output) {
  std::string id;
  for (char c : output) {
    if (std::isdigit(static_cast<unsigned char>(c)) != 0) {
      id += c;
    } else if (c == ';' || c == '\n') {
      break;
    } else {
      return "";
    }
  }
  return id;
}

}  // namespace servetune::tuner
