// A fixed pool of threads running posted jobs in FIFO order: the server prepares requests here (JSON parsing,
// chat templating, tokenizing a long prompt) so that no I/O thread ever waits on one request's prompt.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace servetune::server {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);  // threads >= 1
  // Drops the jobs not yet started and joins the threads (a running job finishes first).
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Thread-safe. A job must not throw.
  void post(std::function<void()> job);

 private:
  void work();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // last: started once the state above exists
};

}  // namespace servetune::server
