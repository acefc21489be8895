// Helpers for the tuner's end-to-end tests: run the servetune binary (exit code + output), scratch folders, files.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servetune::testing {

struct CliResult {
  int code = -1;
  std::string output;
};

// Runs `servetune ARGS` through the shell (ARGS may set env vars with `env K=V`), stdout + stderr captured.
inline CliResult servetune(const std::string& args, const std::string& env = "") {
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(SERVETUNE_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CliResult r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs a shell command; true when it exits 0.
inline bool servetune_shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

inline std::filesystem::path scratch(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / ("servetune_it_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

inline void write_text(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::json read_json(const std::filesystem::path& p) { return nlohmann::json::parse(read_text(p)); }

// Finished files only: a killed writer can leave "NAME.json.tmp.PID" behind, which is not a result.
inline bool is_finished_json(const std::filesystem::directory_entry& e) {
  return e.is_regular_file() && e.path().extension() == ".json";
}

inline size_t count_files(const std::filesystem::path& dir) {
  size_t n = 0;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) n += is_finished_json(e) ? 1 : 0;
  return n;
}

// True while a process whose command line contains `needle` exists (this test binary's own aside).
inline bool process_running(const std::string& needle) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_text(e.path() / "cmdline");
    for (char& c : cmd) c = c == '\0' ? ' ' : c;
    if (cmd.find(needle) != std::string::npos && cmd.find("servetune_it_") == std::string::npos) return true;
  }
  return false;
}

// Starts `servetune ARGS...` in the background, output discarded; the caller waits for (or kills) the pid.
template <typename... Args>
pid_t spawn_servetune(const Args&... args) {
  const std::vector<std::string> argv_s = {SERVETUNE_BIN, std::string(args)...};
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    (void)!std::freopen("/dev/null", "w", stdout);
    (void)!std::freopen("/dev/null", "w", stderr);
    ::execv(SERVETUNE_BIN, argv.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace servetune::testing
