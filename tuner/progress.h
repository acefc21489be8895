// Sweep progress on stderr: on a terminal, one status line redrawn every second with the current candidate, its
// ETA and the sweep's ETA; otherwise one line per finished run (for logs). ETAs use the mean run time so far.
// Fork-aware, because built-in candidates run in a child process (see sweep_runner.cpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace servetune::tuner {

class Progress {
 public:
  Progress(std::FILE* out, size_t planned_runs);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_planned(size_t planned_runs);
  void trial_started(const std::string& candidate, const std::string& label, size_t runs);
  void run_started(const std::string& workload, int repeat);
  void run_finished(const std::string& summary);
  void skip_runs(size_t runs);  // runs already complete (resume) or never to happen (skipped / failed candidate)
  // A line that stays (clears the status line first on a terminal).
  void note(const std::string& line);

  // A trial that runs in a forked child: the child carries on with its copy of this object (and its own ticker);
  // the parent stays quiet until the child is done, then counts the child's runs.
  void before_fork();
  void after_fork_parent();
  void after_fork_child();
  void child_done(size_t runs, double seconds);

 private:
  using Clock = std::chrono::steady_clock;
  std::string status_locked() const;
  void draw_locked();
  void ticker();

  std::FILE* out_;
  bool tty_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::unique_ptr<std::thread> thread_;
  bool paused_ = false;
  size_t planned_ = 0;
  size_t done_ = 0;        // runs finished or skipped
  size_t measured_ = 0;    // runs measured in this process
  double measured_s_ = 0;  // their total time
  std::string candidate_, label_, workload_;
  int repeat_ = 0;
  size_t trial_runs_ = 0, trial_done_ = 0;
  Clock::time_point run_start_{}, sweep_start_;
  bool running_ = false;
};

std::string format_duration(double seconds);  // "42s", "3m05s", "1h02m"

}  // namespace servetune::tuner
