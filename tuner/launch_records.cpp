// Launch records and the reaping of what a killed sweep left running (see launch_records.h).
#include "tuner/launch_records.h"

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "tuner/process_tree.h"
#include "tuner/results_store.h"

namespace servetune::tuner {
namespace fs = std::filesystem;
namespace {

fs::path record_path(const std::string& run_dir, const std::string& name) {
  return fs::path(run_dir) / "launches" / (name + ".json");
}

// The processes a record's server may have left: its supervisor (same start time), and whatever runs in the
// supervisor's session or the shell's process group and started no earlier than the supervisor.
std::vector<pid_t> leftovers(pid_t supervisor, uint64_t start_ticks, pid_t group) {
  std::vector<pid_t> out;
  for (const auto& p : all_process_stats()) {
    if (p.start_ticks < start_ticks) continue;
    if (p.pid == supervisor || p.sid == supervisor || (group > 0 && p.pgid == group)) out.push_back(p.pid);
  }
  return out;
}

}  // namespace

void write_launch_record(const std::string& run_dir, const std::string& name, const std::string& candidate,
                         const ServerProcess& process) {
  nlohmann::ordered_json j;
  j["candidate"] = candidate;
  j["supervisor_pid"] = process.supervisor_pid();
  j["supervisor_start_ticks"] = process.supervisor_start_ticks();
  j["server_process_group"] = process.shell_pid();
  j["started"] = now_iso8601();
  write_file_atomic(record_path(run_dir, name).string(), j.dump(2) + "\n");
}

void remove_launch_record(const std::string& run_dir, const std::string& name) {
  std::error_code ec;
  fs::remove(record_path(run_dir, name), ec);
}

std::vector<std::string> reap_leftover_servers(const std::string& run_dir) {
  std::vector<std::string> reaped;
  const fs::path dir = fs::path(run_dir) / "launches";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return reaped;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path& path = entry.path();
    if (path.extension() != ".json") continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text_file(path.string()));
    } catch (const std::exception&) {
      continue;  // not one of ours (records are written atomically)
    }
    if (!j.is_object()) continue;
    const pid_t supervisor = j.value("supervisor_pid", 0);
    const uint64_t ticks = j.value("supervisor_start_ticks", uint64_t{0});
    const pid_t group = j.value("server_process_group", 0);
    std::vector<pid_t> left = supervisor > 0 ? leftovers(supervisor, ticks, group) : std::vector<pid_t>{};
    if (!left.empty()) {
      std::string what;
      for (pid_t p : left) what += (what.empty() ? "" : ", ") + describe_process(p);
      // SIGTERM first (a live supervisor then stops its whole tree), SIGKILL for whatever is left after 10 s.
      for (int sig : {SIGTERM, SIGKILL}) {
        for (pid_t p : left) ::kill(p, sig);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(sig == SIGTERM ? 10 : 2);
        while (!leftovers(supervisor, ticks, group).empty() && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        left = leftovers(supervisor, ticks, group);
        if (left.empty()) break;
      }
      reaped.push_back(j.value("candidate", std::string("?")) + ": stopped " + what +
                       (left.empty() ? "" : " (some still run: " + std::to_string(left.size()) + " processes)"));
    }
    fs::remove(path, ec);
  }
  return reaped;
}

}  // namespace servetune::tuner
