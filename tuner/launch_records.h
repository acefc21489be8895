// The run folder's launches/: one file per external server while it runs (its supervisor's pid and start time, the
// server's process group), removed when the candidate is torn down. A file that outlives its sweep names what a
// killed sweep may have left running; --resume stops it first (reap_leftover_servers).
#pragma once

#include <string>
#include <vector>

#include "tuner/server_process.h"

namespace servetune::tuner {

// Writes launches/<name>.json (atomically) for the running `process` of `candidate`.
void write_launch_record(const std::string& run_dir, const std::string& name, const std::string& candidate,
                         const ServerProcess& process);
void remove_launch_record(const std::string& run_dir, const std::string& name);

// For each launch record left in the run folder: stops the supervisor if it still runs (it stops its tree), and
// every process of the server's session or process group that started after it (a pid reused since is left alone:
// matched by start time); removes the record. Returns one line per record that still had processes running.
std::vector<std::string> reap_leftover_servers(const std::string& run_dir);

}  // namespace servetune::tuner
