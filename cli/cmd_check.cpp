// `servetune check --baseline FILE|DIR --current FILE|DIR [--tolerance METRIC=[+|-|~]N[%]]...`: the CI regression
// check (see report/check.h). Exit 0 within tolerance, 1 on a regression, 2 for a usage error.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "commands.h"
#include "report/check.h"
#include "tuner/results_store.h"

namespace servetune::cli {
namespace {

struct CheckOptions {
  std::string baseline;
  std::string current;
  std::vector<std::string> tolerances;
};

// check.tolerances of the sweep that produced `dir`, when it is a run folder.
std::vector<std::string> sweep_tolerances(const std::string& dir) {
  tuner::ResultsStore store(dir);
  if (!std::filesystem::is_directory(dir) || !store.exists()) return {};
  const auto doc = store.sweep().at("document");
  std::vector<std::string> out;
  if (doc.contains("check") && doc["check"].is_object() && doc["check"].contains("tolerances")) {
    for (const auto& t : doc["check"]["tolerances"]) {
      if (t.is_string()) out.push_back(t.get<std::string>());
    }
  }
  return out;
}

void run_check(const CheckOptions& o) {
  std::vector<std::string> texts = o.tolerances;
  if (texts.empty()) texts = sweep_tolerances(o.current);
  if (texts.empty()) texts = sweep_tolerances(o.baseline);
  if (texts.empty()) texts = report::default_tolerances();
  std::vector<report::Tolerance> tolerances;
  for (const auto& t : texts) tolerances.push_back(report::parse_tolerance(t));
  const report::CheckResult r = report::run_check(tuner::load_records(o.baseline), tuner::load_records(o.current), tolerances);
  report::print_check(stdout, r);
  if (r.regressions > 0) {
    std::fflush(stdout);
    std::exit(1);
  }
}

void add_check_command(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand("check", "Compare results to a baseline metric by metric; exit 1 on a regression");
  cmd->add_option("--baseline", o->baseline, "Baseline: a run folder, a folder of records, or one result file")->required();
  cmd->add_option("--current", o->current, "Current results: a run folder, a folder of records, or one result file")->required();
  cmd->add_option("--tolerance", o->tolerances,
                  "METRIC=[+|-|~]AMOUNT[%]: '-5%' fails a drop over 5%, '+10%' a rise over 10%, '0' any change; "
                  "'-noise' a drop beyond the baseline's spread over its repeats (default: the sweep file's "
                  "check.tolerances)");
  cmd->callback([o] { run_check(*o); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(70, add_check_command);

}  // namespace servetune::cli
