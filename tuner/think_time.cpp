// Think times for multi-turn runs (see think_time.h).
#include "tuner/think_time.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "datasets/rng.h"
#include "servetune/error.h"

namespace servetune::tuner {

std::vector<double> read_think_trace(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) throw_usage("--think-time-trace " + path + ": no such file");
  std::ifstream in(path);
  if (!in) throw_usage("--think-time-trace " + path + ": cannot open it");
  std::vector<double> values;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const size_t e = line.find_last_not_of(" \t\r") + 1;
    double v = 0;
    const auto [p, ec] = std::from_chars(line.data() + b, line.data() + e, v);
    if (ec != std::errc() || p != line.data() + e || !std::isfinite(v) || v < 0.0) {
      throw_usage("--think-time-trace " + path + ":" + std::to_string(line_no) + ": '" + line.substr(b, e - b) +
                  "' is not a number of seconds >= 0 (one a line)");
    }
    values.push_back(v);
  }
  if (values.empty()) throw_usage("--think-time-trace " + path + ": no think times (one number of seconds a line)");
  return values;
}

void check_think_time(double think_s, const std::string& dist, const std::string& trace) {
  const bool from_trace = dist == "trace" || dist == "trace-replay";
  if (!from_trace && dist != "fixed" && dist != "exponential") {
    throw_usage("--think-time-dist must be fixed, exponential, trace or trace-replay, got '" + dist + "'");
  }
  if (!(think_s >= 0.0) || std::isinf(think_s)) throw_usage("--think-time must be a number of seconds >= 0");
  if (!from_trace) {
    if (!trace.empty()) throw_usage("--think-time-trace " + trace + " needs --think-time-dist trace or trace-replay");
    return;
  }
  if (trace.empty()) throw_usage("--think-time-dist " + dist + " needs --think-time-trace FILE");
  if (think_s != 0.0) throw_usage("--think-time does not apply with --think-time-dist " + dist + " (the trace gives the seconds)");
  (void)read_think_trace(trace);
}

std::vector<double> think_times(const datasets::Workload& workload, double think_s, const std::string& dist,
                                uint64_t seed, const std::string& trace) {
  check_think_time(think_s, dist, trace);
  const std::vector<double> values = trace.empty() ? std::vector<double>{} : read_think_trace(trace);
  std::vector<double> t(workload.requests.size(), 0.0);
  datasets::Rng rng(seed ^ 0x5468696e6b54696dull);
  size_t k = 0;  // later turns so far (trace-replay's position)
  for (size_t i = 0; i < t.size(); ++i) {
    if (workload.requests[i].turn == 0) continue;
    if (dist == "trace") {
      t[i] = values[rng.below(values.size())];
    } else if (dist == "trace-replay") {
      t[i] = values[k++ % values.size()];
    } else if (think_s > 0.0) {
      t[i] = dist == "fixed" ? think_s : rng.exponential(1.0 / think_s);
    }
  }
  return t;
}

}  // namespace servetune::tuner
