// `servetune tp-worker` (hidden): one local rank of a node's tensor-parallel processes (comm_backend gloo with
// tp_size / nnodes > 1), started by the node's own process through the launcher registered here, never by hand.
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "servetune/error.h"
#include "servetune/tensor_parallel_worker.h"

extern char** environ;

namespace servetune::cli {
namespace {

// How long a worker may take to exit after its group ends before it is killed.
constexpr auto kExitGrace = std::chrono::seconds(10);

class SpawnedWorker final : public WorkerProcess {
 public:
  explicit SpawnedWorker(pid_t pid) : pid_(pid) {}
  ~SpawnedWorker() override {
    const auto deadline = std::chrono::steady_clock::now() + kExitGrace;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  pid_t pid_;
};

std::unique_ptr<WorkerProcess> launch(const EngineConfig& config, int local_rank) {
  const nlohmann::json j = config;
  std::vector<std::string> args = {std::filesystem::read_symlink("/proc/self/exe").string(), "tp-worker", "--engine-config", j.dump(),
                                   "--local-rank", std::to_string(local_rank)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (const int err = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ); err != 0) {
    throw_io(args[0], "cannot start tensor-parallel worker process: " + std::string(std::strerror(err)));
  }
  return std::make_unique<SpawnedWorker>(pid);
}

void add_tp_worker_command(CLI::App& app) {
  set_worker_launcher(launch);
  auto json = std::make_shared<std::string>();
  auto local_rank = std::make_shared<int>(0);
  CLI::App* cmd = app.add_subcommand("tp-worker", "A node's local tensor-parallel rank (started by servetune itself)");
  cmd->group("");  // hidden from --help
  cmd->add_option("--engine-config", *json, "The node's EngineConfig as JSON")->required();
  cmd->add_option("--local-rank", *local_rank, "Local rank on this node (1 .. tp_size / nnodes - 1)")->required();
  cmd->callback([json, local_rank] {
    // Dies with the node's process that started it, even while still waiting for the rendezvous (strictly: with the
    // thread that started it; servetune creates its engines on the main thread).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() == 1) throw Error(ErrorKind::kIo, "the process that started this tensor-parallel worker has gone");
    run_tensor_parallel_worker(nlohmann::json::parse(*json).get<EngineConfig>(), *local_rank);
  });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(99, add_tp_worker_command);

}  // namespace servetune::cli
