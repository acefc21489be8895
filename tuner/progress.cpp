// Sweep progress and ETA (see progress.h).
#include "tuner/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace servetune::tuner {

std::string format_duration(double s) {
  if (!(s >= 0) || std::isinf(s)) return "?";
  const long long t = std::llround(s);
  char buf[32];
  if (t < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", t);
  } else if (t < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  }
  return buf;
}

Progress::Progress(std::FILE* out, size_t planned_runs)
    : out_(out), tty_(out != nullptr && ::isatty(::fileno(out)) != 0), planned_(planned_runs), sweep_start_(Clock::now()) {
  if (tty_) thread_ = std::make_unique<std::thread>([this] { ticker(); });
}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    if (tty_) std::fprintf(out_, "\r\033[K");
  }
  cv_.notify_all();
  if (thread_ && thread_->joinable()) thread_->join();
  if (out_ != nullptr) std::fflush(out_);
}

void Progress::set_planned(size_t planned_runs) {
  std::lock_guard<std::mutex> lock(mutex_);
  planned_ = planned_runs;
}

void Progress::trial_started(const std::string& candidate, const std::string& label, size_t runs) {
  std::lock_guard<std::mutex> lock(mutex_);
  candidate_ = candidate;
  label_ = label;
  trial_runs_ = runs;
  trial_done_ = 0;
  if (!tty_ && out_ != nullptr) {
    std::fprintf(out_, "%s (%s): launching, %zu runs\n", candidate.c_str(), label.c_str(), runs);
    std::fflush(out_);
  }
}

void Progress::run_started(const std::string& workload, int repeat) {
  std::lock_guard<std::mutex> lock(mutex_);
  workload_ = workload;
  repeat_ = repeat;
  run_start_ = Clock::now();
  running_ = true;
  draw_locked();
}

void Progress::run_finished(const std::string& summary) {
  std::lock_guard<std::mutex> lock(mutex_);
  const double s = std::chrono::duration<double>(Clock::now() - run_start_).count();
  running_ = false;
  ++measured_;
  measured_s_ += s;
  ++done_;
  ++trial_done_;
  if (out_ == nullptr) return;
  if (tty_) std::fprintf(out_, "\r\033[K");
  std::fprintf(out_, "  %s %s r%d: %s (%.1fs)%s\n", candidate_.c_str(), workload_.c_str(), repeat_, summary.c_str(), s,
               tty_ ? "" : ("  " + status_locked()).c_str());
  draw_locked();
}

void Progress::skip_runs(size_t runs) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ += runs;
}

void Progress::note(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (out_ == nullptr) return;
  if (tty_) std::fprintf(out_, "\r\033[K");
  std::fprintf(out_, "%s\n", line.c_str());
  draw_locked();
}

void Progress::before_fork() {
  if (out_ != nullptr) std::fflush(out_);
  mutex_.lock();
}

void Progress::after_fork_parent() {
  paused_ = true;
  mutex_.unlock();
}

void Progress::after_fork_child() {
  // The parent's ticker thread does not exist here: forget its handle (never joined) and start our own.
  (void)thread_.release();
  mutex_.unlock();
  if (tty_) thread_ = std::make_unique<std::thread>([this] { ticker(); });
}

void Progress::child_done(size_t runs, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  paused_ = false;
  done_ += runs;
  measured_ += runs;
  measured_s_ += seconds;
}

std::string Progress::status_locked() const {
  const double mean = measured_ > 0 ? measured_s_ / static_cast<double>(measured_) : NAN;
  const double current = running_ ? std::chrono::duration<double>(Clock::now() - run_start_).count() : 0.0;
  const size_t planned = std::max(planned_, done_ + (running_ ? 1 : 0));
  const double left_trial = mean * static_cast<double>(trial_runs_ - std::min(trial_runs_, trial_done_)) - current;
  const double left_sweep = mean * static_cast<double>(planned - done_) - current;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "[%zu/%zu runs, %s elapsed] candidate ETA %s, sweep ETA %s", done_, planned,
                format_duration(std::chrono::duration<double>(Clock::now() - sweep_start_).count()).c_str(),
                format_duration(std::max(0.0, left_trial)).c_str(), format_duration(std::max(0.0, left_sweep)).c_str());
  return buf;
}

void Progress::draw_locked() {
  if (!tty_ || !running_ || paused_ || out_ == nullptr) return;
  const double current = std::chrono::duration<double>(Clock::now() - run_start_).count();
  std::fprintf(out_, "\r\033[K%s %s r%d %s | %s", candidate_.c_str(), workload_.c_str(), repeat_,
               format_duration(current).c_str(), status_locked().c_str());
  std::fflush(out_);
}

void Progress::ticker() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::seconds(1));
    if (!stop_) draw_locked();
  }
}

}  // namespace servetune::tuner
