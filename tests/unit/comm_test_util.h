// Test helpers for the communicators: run a function on N ranks as threads, each with its own communicator of
// the named backend (local: one shared LocalGroup; gloo: one gloo context per thread over a FileStore folder).
#pragma once

#include <exception>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/local_communicator.h"

namespace servetune::test {

inline std::string fresh_store_dir() {
  static std::mt19937_64 rng(std::random_device{}());
  auto dir = std::filesystem::temp_directory_path() / ("servetune_comm_" + std::to_string(rng()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

struct RankOutcome {
  std::exception_ptr error;
  std::string message;
};

// Runs body(comm) on `size` threads; rank r's communicator is created on its thread unless skip(r) (that rank
// never joins). Returns each rank's outcome.
inline std::vector<RankOutcome> run_ranks(const std::string& backend, int size, std::chrono::milliseconds timeout,
                                          const std::function<void(Communicator&)>& body,
                                          const std::function<bool(int)>& skip = {}) {
  CommSpec base;
  base.size = size;
  base.timeout = timeout;
  if (backend == "local") base.local_group = LocalGroup::create(size, timeout);
  const std::string dir = backend == "gloo" ? fresh_store_dir() : "";
  base.file_store_path = dir;
  std::vector<RankOutcome> outcomes(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    if (skip && skip(r)) continue;
    threads.emplace_back([&, r] {
      try {
        CommSpec spec = base;
        spec.rank = r;
        auto comm = make_communicator(backend, spec);
        body(*comm);
      } catch (const std::exception& e) {
        outcomes[static_cast<size_t>(r)].error = std::current_exception();
        outcomes[static_cast<size_t>(r)].message = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!dir.empty()) std::filesystem::remove_all(dir);
  return outcomes;
}

}  // namespace servetune::test
