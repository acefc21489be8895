// Regression check (see check.h).
#include "report/check.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "report/report.h"
#include "servetune/error.h"
#include "tuner/noise.h"
#include "tuner/results_table.h"

namespace servetune::report {

using namespace tuner;  // records, results tables, specs and command lines are the tuner's
namespace {

// The ISA levels the built-in engine's CPU kernels ran with in these records; empty for external engines and for
// records from before the environment named it.
std::set<std::string> engine_cpu_isas(const std::vector<nlohmann::ordered_json>& records) {
  std::set<std::string> isas;
  for (const auto& r : records) {
    const auto p = r.find("provenance");
    if (p == r.end() || !p->contains("environment")) continue;
    const auto& env = (*p)["environment"];
    if (env.contains("engine_cpu_isa") && env["engine_cpu_isa"].is_string())
      isas.insert(env["engine_cpu_isa"].get<std::string>());
  }
  return isas;
}

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

}  // namespace

const std::vector<std::string>& default_tolerances() {
  static const std::vector<std::string> t = {"completed=0", "failed=+0", "total_output_tokens=0",
                                             "total_token_throughput=-10%", "mean_tpot_ms=+10%"};
  return t;
}

Tolerance parse_tolerance(const std::string& text) {
  Tolerance t;
  t.text = text;
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) throw_usage("--tolerance '" + text + "': expected METRIC=[+|-|~]AMOUNT[%] or METRIC=[+|-|~]noise, e.g. total_token_throughput=-5%");
  t.metric = text.substr(0, eq);
  std::string v = text.substr(eq + 1);
  if (v.rfind("\xC2\xB1", 0) == 0) v = "~" + v.substr(2);  // ±
  if (!v.empty() && (v[0] == '+' || v[0] == '-' || v[0] == '~')) {
    t.direction = v[0];
    v = v.substr(1);
  }
  if (v == "noise") {
    t.noise = true;
    t.relative = false;
    return t;
  }
  t.relative = !v.empty() && v.back() == '%';
  if (t.relative) v.pop_back();
  char* end = nullptr;
  t.amount = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(t.amount >= 0)) {
    throw_usage("--tolerance '" + text + "': the amount must be a non-negative number, optionally with %, or 'noise'");
  }
  return t;
}

CheckResult run_check(const std::vector<nlohmann::ordered_json>& baseline, const std::vector<nlohmann::ordered_json>& current,
                      const std::vector<Tolerance>& tolerances) {
  const ResultsTable base = ResultsTable::build(baseline), cur = ResultsTable::build(current);
  std::map<std::string, std::string> pair;  // baseline candidate -> current candidate
  for (const auto& c : base.candidates()) {
    if (cur.candidate(c.id)) pair[c.id] = c.id;
  }
  if (pair.empty() && base.candidates().size() == 1 && cur.candidates().size() == 1) {
    pair[base.candidates()[0].id] = cur.candidates()[0].id;
  }
  if (pair.empty()) throw_usage("check: the baseline and the current results share no candidate");
  CheckResult result;
  for (const auto& [bid, cid] : pair) {
    for (const auto& w : base.workloads()) {
      const Cell* bc = base.cell(bid, w);
      if (bc == nullptr) continue;
      const Cell* cc = cur.cell(cid, w);
      for (const Tolerance& t : tolerances) {
        const auto bv = bc->metrics.find(t.metric);
        if (bv == bc->metrics.end()) throw_usage("check: the baseline has no metric '" + t.metric + "' (candidate " + bid + ", workload " + w + ")");
        CheckRow row;
        row.candidate = cid;
        row.workload = w;
        row.metric = t.metric;
        row.baseline = bv->second;
        row.tolerance = t.text;
        std::optional<double> cv;
        if (cc != nullptr) {
          const auto it = cc->metrics.find(t.metric);
          if (it != cc->metrics.end()) cv = it->second;
        }
        double allowed = t.relative ? std::fabs(row.baseline) * t.amount / 100.0 : t.amount;
        if (t.noise) {
          // Means on both sides, and the bar from the baseline's spread for as many runs as the current cell has.
          const std::vector<double>& bs = bc->samples.at(t.metric);
          const auto cs = cc != nullptr && cc->samples.count(t.metric) ? cc->samples.at(t.metric) : std::vector<double>{};
          const auto allowance = noise_allowance(bs, std::max<size_t>(1, cs.size()));
          if (!allowance) {
            throw_usage("check: --tolerance " + t.text + " needs at least two repeats in the baseline (candidate " + bid +
                        ", workload " + w + " has " + std::to_string(bs.size()) + ")");
          }
          allowed = *allowance;
          row.baseline = std::accumulate(bs.begin(), bs.end(), 0.0) / static_cast<double>(bs.size());
          if (!cs.empty()) cv = std::accumulate(cs.begin(), cs.end(), 0.0) / static_cast<double>(cs.size());
        }
        if (!cv) {
          row.missing = row.regression = true;
        } else {
          row.current = *cv;
          const double diff = row.current - row.baseline;
          const double slack = 1e-9 * std::max(1.0, std::fabs(row.baseline));
          const bool up = diff > allowed + slack, down = -diff > allowed + slack;
          row.regression = t.direction == '~' ? (up || down) : (t.direction == '+' ? up : down);
          row.improved = !row.regression && ((t.direction == '+' && diff < 0) || (t.direction == '-' && diff > 0));
        }
        if (row.regression) ++result.regressions;
        result.rows.push_back(row);
      }
    }
  }
  if (result.rows.empty()) throw_usage("check: no workload of the baseline has results to compare");
  const std::set<std::string> base_isa = engine_cpu_isas(baseline), cur_isa = engine_cpu_isas(current);
  if (!base_isa.empty() && !cur_isa.empty() && base_isa != cur_isa) {
    result.warning = "the baseline ran the built-in engine's CPU kernels at ISA " + join(base_isa) +
                     ", the current results at " + join(cur_isa) +
                     "; their speeds differ by design (compare against a baseline of the same ISA)";
  }
  return result;
}

void print_check(std::FILE* out, const CheckResult& r) {
  if (!r.warning.empty()) std::fprintf(out, "check: warning: %s\n", r.warning.c_str());
  std::fprintf(out, "%-10s %-22s %-30s %14s %14s %9s  %-26s %s\n", "candidate", "workload", "metric", "baseline", "current",
               "change", "tolerance", "verdict");
  for (const auto& row : r.rows) {
    const std::string change = row.missing ? "n/a" : (row.baseline == 0.0 ? (row.current == 0.0 ? "+0.0%" : "n/a") : format_change(row.baseline, row.current));
    char b[32], c[32];
    std::snprintf(b, sizeof(b), "%.6g", row.baseline);
    std::snprintf(c, sizeof(c), "%.6g", row.current);
    std::fprintf(out, "%-10s %-22s %-30s %14s %14s %9s  %-26s %s\n", row.candidate.c_str(), row.workload.c_str(), row.metric.c_str(), b,
                 row.missing ? "missing" : c, change.c_str(), row.tolerance.c_str(),
                 row.regression ? "REGRESSION" : (row.improved ? "better" : "ok"));
  }
  if (r.regressions > 0) {
    std::fprintf(out, "check: %zu of %zu comparisons regressed beyond their tolerance\n", r.regressions, r.rows.size());
  } else {
    std::fprintf(out, "check: all %zu comparisons within tolerance\n", r.rows.size());
  }
  std::fflush(out);
}

}  // namespace servetune::report
