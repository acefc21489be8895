// `servetune check`: compares current results to a baseline metric by metric (each cell's median over repeats)
// under tolerances such as "total_token_throughput=-5%" (a drop of more than 5% regresses), "p99_tpot_ms=+10%"
// (a rise of more than 10% regresses), "total_output_tokens=0" (any change regresses) or "engine_steps=~3%"
// (a change either way beyond 3%); an absolute amount has no '%'. The amount `noise` ("total_token_throughput=-noise")
// is the baseline's own spread over its repeats: the current mean regresses when it lies beyond the baseline's 99%
// prediction interval for that many new runs (tuner/noise.h), so a noisy machine's repeats set the bar.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servetune::report {

struct Tolerance {
  std::string metric;
  char direction = '~';  // '-': a decrease regresses, '+': an increase regresses, '~': either
  double amount = 0.0;
  bool relative = true;  // amount in percent of the baseline
  bool noise = false;    // amount from the baseline's repeats (`noise`)
  std::string text;
};

// Throws Error(kUsage) naming the text when it is not METRIC=[+|-|~]AMOUNT[%] or METRIC=[+|-|~]noise.
Tolerance parse_tolerance(const std::string& text);

struct CheckRow {
  std::string candidate;
  std::string workload;
  std::string metric;
  double baseline = 0.0;
  double current = 0.0;
  bool missing = false;  // the current results lack this cell or metric
  bool regression = false;
  bool improved = false;
  std::string tolerance;
};

struct CheckResult {
  std::vector<CheckRow> rows;
  size_t regressions = 0;
  std::string warning;  // "" or why the comparison may not be like for like
};

// Pairs cells by (candidate, workload); when each side has a single candidate they are paired whatever their ids.
// Throws Error(kUsage) when a tolerance names a metric the baseline does not have, a `noise` tolerance meets a
// baseline cell with fewer than two repeats, or nothing pairs up. The result
// warns when the two sides ran the built-in engine's CPU kernels at different ISA levels
// (provenance.environment.engine_cpu_isa), whose speeds differ several-fold by design.
CheckResult run_check(const std::vector<nlohmann::ordered_json>& baseline, const std::vector<nlohmann::ordered_json>& current,
                      const std::vector<Tolerance>& tolerances);
void print_check(std::FILE* out, const CheckResult& result);

// Tolerances used when none are given on the command line nor in the sweep file's check.tolerances.
const std::vector<std::string>& default_tolerances();

}  // namespace servetune::report
