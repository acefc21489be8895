// The machine and build a result was measured on, for the result JSON (see report.h environment_json).
#include <sys/utsname.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <thread>

#include "loadgen/report.h"

namespace servetune::loadgen {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "";
}

// First line of a command's stdout, "" when it fails.
std::string command_line(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::array<char, 256> buf{};
  std::string out;
  if (std::fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) out = buf.data();
  const int rc = pclose(p);
  if (rc != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

}  // namespace

nlohmann::ordered_json environment_json(const std::string& servetune_version) {
  nlohmann::ordered_json j;
  j["cpu_model"] = cpu_model();
  j["logical_cpus"] = std::thread::hardware_concurrency();
  utsname u{};
  if (uname(&u) == 0) {
    j["os"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
    j["hostname"] = u.nodename;
  }
  j["servetune_version"] = servetune_version;
  const std::string src = SERVETUNE_SOURCE_DIR;
  // Read-only git queries; GIT_OPTIONAL_LOCKS=0 keeps `git status` from refreshing the index.
  const std::string commit = command_line("git -C '" + src + "' rev-parse HEAD 2>/dev/null");
  if (!commit.empty()) {
    j["git_commit"] = commit;
    j["git_dirty"] = !command_line("GIT_OPTIONAL_LOCKS=0 git -C '" + src +
                                   "' status --porcelain --untracked-files=no 2>/dev/null | head -1")
                           .empty();
  } else {
    j["git_commit"] = nullptr;
  }
  return j;
}

}  // namespace servetune::loadgen
