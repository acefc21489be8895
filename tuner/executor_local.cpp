// Local executors (see executor.h): trials one after another in this process's tree, or --parallel K trials at once
// as processes of their own, each on its share of the CPUs (its affinity mask: the engine's `threads = 0` means the
// share) and, when the sweep names target.devices, on devices no other running trial holds.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <sstream>
#include <thread>

#include "servetune/error.h"
#include "tuner/executor.h"
#include "tuner/interrupt.h"
#include "tuner/progress.h"
#include "tuner/server_process.h"
#include "tuner/trial_runner.h"

extern char** environ;

namespace servetune::tuner {
namespace fs = std::filesystem;
namespace {

constexpr int kTrialFailedExit = 3;  // `sweep --trial`: the candidate failed and its marker is written

class SerialExecutor final : public Executor {
 public:
  explicit SerialExecutor(const ExecutorContext& c) : c_(c) {}

  size_t run(const std::vector<Trial>& trials) override {
    refuse_live_slurm_jobs(c_.store, trials);
    size_t failed = 0;
    for (const Trial& t : trials) {
      if (interrupted_by() != 0) break;
      if (!c_.runner.run(t)) ++failed;
    }
    return failed;
  }

 private:
  ExecutorContext c_;
};

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) throw Error(ErrorKind::kIo, std::string("sched_getaffinity: ") + std::strerror(errno));
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) cpus.push_back(i);
  }
  return cpus;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The ids of target.devices: numbered within this process's CUDA_VISIBLE_DEVICES when it is set.
std::vector<std::string> device_ids(const SweepSpec& spec) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::vector<std::string> ids = visible != nullptr ? split_commas(visible) : std::vector<std::string>();
  if (visible == nullptr) {
    for (int64_t d = 0; d < *spec.target.devices; ++d) ids.push_back(std::to_string(d));
  }
  if (ids.size() < static_cast<size_t>(*spec.target.devices)) {
    throw_usage(spec.source + ": target.devices is " + std::to_string(*spec.target.devices) + " but CUDA_VISIBLE_DEVICES lists " +
                std::to_string(ids.size()));
  }
  ids.resize(static_cast<size_t>(*spec.target.devices));
  return ids;
}

class ParallelExecutor final : public Executor {
 public:
  ParallelExecutor(const ExecutorOptions& o, const ExecutorContext& c) : c_(c) {
    const std::vector<int> cpus = allowed_cpus();
    const auto k = static_cast<size_t>(o.parallel);
    for (size_t i = 0; i < k; ++i) {  // contiguous shares, sizes differing by at most one
      shares_.push_back({std::vector<int>(cpus.begin() + static_cast<long>(i * cpus.size() / k),
                                          cpus.begin() + static_cast<long>((i + 1) * cpus.size() / k)),
                         false});
    }
    if (c.spec.target.devices) {
      for (auto& id : device_ids(c.spec)) devices_.push_back({id, false});
    }
  }

  size_t run(const std::vector<Trial>& trials) override {
    refuse_live_slurm_jobs(c_.store, trials);
    std::deque<Trial> queue(trials.begin(), trials.end());
    failed_ = 0;
    error_.reset();
    bool stopping = false;
    while (!queue.empty() || !running_.empty()) {
      if (!stopping && (interrupted_by() != 0 || error_)) {
        stopping = true;
        queue.clear();
        for (const auto& r : running_) ::kill(r.pid, SIGTERM);  // each records its trial as interrupted
      }
      while (!queue.empty() && start(queue.front())) queue.pop_front();
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (error_) throw Error(ErrorKind::kInternal, *error_);
    return failed_;
  }

 private:
  struct Share {
    std::vector<int> cpus;
    bool busy;
  };
  struct Device {
    std::string id;
    bool busy;
  };
  struct Running {
    Trial trial;
    pid_t pid;
    size_t share;
    std::vector<size_t> devices;
    std::chrono::steady_clock::time_point start;
  };

  // Starts the trial when a share (and its devices) is free; false when it has to wait.
  bool start(const Trial& t) {
    size_t share = shares_.size();
    for (size_t i = 0; i < shares_.size() && share == shares_.size(); ++i) {
      if (!shares_[i].busy) share = i;
    }
    if (share == shares_.size()) return false;
    std::vector<size_t> devices;
    if (!devices_.empty()) {
      const auto need = static_cast<size_t>(std::max<int64_t>(1, c_.space.devices_needed(t.candidate)));
      for (size_t i = 0; i < devices_.size() && devices.size() < need; ++i) {
        if (!devices_[i].busy) devices.push_back(i);
      }
      if (devices.size() < need) return false;
    }
    const std::vector<std::string> argv_s = trial_command(c_.store.dir(), t);
    std::vector<char*> argv;
    for (const auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    std::vector<std::string> ids;
    for (size_t d : devices) ids.push_back(devices_[d].id);
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      if (!ids.empty() && (kv.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0 || kv.rfind("HIP_VISIBLE_DEVICES=", 0) == 0)) continue;
      env_s.push_back(kv);
    }
    if (!ids.empty()) {
      env_s.push_back("CUDA_VISIBLE_DEVICES=" + join(ids, ","));
      env_s.push_back("HIP_VISIBLE_DEVICES=" + join(ids, ","));
    }
    std::vector<char*> envp;
    for (auto& kv : env_s) envp.push_back(kv.data());
    envp.push_back(nullptr);
    const std::string log = trial_log_path(c_.store, t);
    fs::create_directories(fs::path(log).parent_path());
    cpu_set_t mask;
    CPU_ZERO(&mask);
    for (int cpu : shares_[share].cpus) CPU_SET(cpu, &mask);
    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Its own process group: the terminal's Ctrl-C reaches the sweep, which stops each trial with SIGTERM.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
      reset_interrupt_handlers();
      ::sched_setaffinity(0, sizeof mask, &mask);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    if (pid < 0) throw Error(ErrorKind::kIo, std::string("cannot fork for trial ") + trial_key(t) + ": " + std::strerror(errno));
    shares_[share].busy = true;
    for (size_t d : devices) devices_[d].busy = true;
    std::string where = "cpus " + std::to_string(shares_[share].cpus.front()) +
                        (shares_[share].cpus.size() > 1 ? "-" + std::to_string(shares_[share].cpus.back()) : "");
    if (!ids.empty()) where += ", devices " + join(ids, ",");
    c_.progress.note(t.candidate.id + " (" + t.candidate.label + "): started (" + where + "; log " +
                     fs::relative(log, c_.store.dir()).string() + ")");
    running_.push_back({t, pid, share, devices, std::chrono::steady_clock::now()});
    return true;
  }

  void reap() {
    for (size_t i = 0; i < running_.size();) {
      int status = 0;
      if (::waitpid(running_[i].pid, &status, WNOHANG) != running_[i].pid) {
        ++i;
        continue;
      }
      const Running r = running_[i];
      running_.erase(running_.begin() + static_cast<long>(i));
      shares_[r.share].busy = false;
      for (size_t d : r.devices) devices_[d].busy = false;
      finish(r, status);
    }
  }

  void finish(const Running& r, int status) {
    const Trial& t = r.trial;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
    if (const auto failed = trial_ended(c_, t, "", seconds)) {
      failed_ += *failed ? 1 : 0;
      return;
    }
    const std::string log = trial_log_path(c_.store, t);
    const std::string log_rel = fs::relative(log, c_.store.dir()).string();
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != kTrialFailedExit &&
        WEXITSTATUS(status) != 127) {
      // The trial's process stopped on an error that is the sweep's (a dataset that cannot be read, ...).
      if (!error_) error_ = "trial " + trial_key(t) + " stopped with an error; " + log + " ends:\n" + tail_lines(log, 5);
      return;
    }
    ++failed_;
    const bool ours = interrupted_by() != 0;
    c_.runner.record_failure(t, ours ? TrialFailure::kInterrupted : TrialFailure::kCrashed,
                             ours ? interruption_reason()
                                  : "the trial's process died (" + describe_wait_status(status) + "); log: " + log_rel,
                             log_rel);
  }

  ExecutorContext c_;
  std::vector<Share> shares_;
  std::vector<Device> devices_;
  std::vector<Running> running_;
  size_t failed_ = 0;
  std::optional<std::string> error_;
};

}  // namespace

void check_local_executor(const ExecutorOptions& o, const SweepSpec& spec) {
  if (o.parallel <= 1) return;
  const size_t cpus = allowed_cpus().size();
  if (cpus < static_cast<size_t>(o.parallel)) {
    throw_usage("--parallel " + std::to_string(o.parallel) + " needs a CPU per trial at least; this process may run on " +
                std::to_string(cpus));
  }
  if (!spec.builtin() && spec.target.port != 0) {
    throw_usage(spec.source + ": target.port " + std::to_string(spec.target.port) + " is one port for " +
                std::to_string(o.parallel) + " servers at once (--parallel); set target.port to 0 (a free port per launch)");
  }
  if (spec.target.devices) device_ids(spec);
}

std::unique_ptr<Executor> make_local_executor(const ExecutorOptions& o, const ExecutorContext& c) {
  if (o.parallel <= 1) return std::make_unique<SerialExecutor>(c);
  return std::make_unique<ParallelExecutor>(o, c);
}

}  // namespace servetune::tuner
