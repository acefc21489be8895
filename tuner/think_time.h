// Think times of multi-turn workloads (the wait between a reply and the session's next turn): fixed, exponential
// (seeded) or from a trace file of seconds, sampled (seeded) or replayed in order. First turns never wait.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "datasets/dataset.h"

namespace servetune::tuner {

// A think-time trace: one number of seconds a line (finite, >= 0; "1.5", "2e-1"); blank lines and lines starting
// with '#' are skipped. Throws Error(kUsage) naming the file, and the line for a bad value; an empty trace is refused.
std::vector<double> read_think_trace(const std::string& path);

// Throws Error(kUsage) naming --think-time / --think-time-dist / --think-time-trace unless: dist is fixed or
// exponential with think_s finite and >= 0 and no trace, or dist is trace (sampled) or trace-replay (in order) with a
// readable trace and think_s 0 (the file gives the seconds).
void check_think_time(double think_s, const std::string& dist, const std::string& trace = "");

// Think times of a plan's requests, 0 for first turns. fixed: think_s; exponential: mean think_s, seeded; trace:
// drawn from the file's values with replacement, seeded; trace-replay: the file's values in order, the k-th later turn
// of the plan (sessions in plan order, turns in order) taking value k, wrapping around at the end of the file. The
// seed's stream is its own, so a seed's arrival times do not change with the think times. Throws as check_think_time.
std::vector<double> think_times(const datasets::Workload& workload, double think_s, const std::string& dist,
                                uint64_t seed, const std::string& trace = "");

}  // namespace servetune::tuner
