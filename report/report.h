// Reports regenerated from a run folder (or any folder of result records): Markdown in the shape of published
// engine-tuning studies (conclusion with the best settings and the command lines that reproduce them, baseline vs
// best across every workload, the gain of each stage, per-candidate tables), a self-contained HTML page with inline
// SVG charts, and summary.csv.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuner/results_table.h"
#include "tuner/strategy.h"
#include "tuner/sweep_spec.h"

namespace servetune::report {

struct ReportData {
  std::string run_dir;
  std::string title;
  std::string description;
  std::optional<tuner::SweepSpec> spec;  // absent for a folder of records only
  tuner::ResultsTable table;
  std::vector<tuner::StageSummary> stages;
  tuner::Goal goal;
  std::string baseline;  // candidate ids; "" when there is none
  std::string best;
  std::vector<std::string> dims;  // settings that differ between candidates (table columns)
  nlohmann::ordered_json environment;
  int repeat = 1;
  // Records made by `servetune import`: {candidate, workload, repeat, format, file, line, locator, model} each.
  std::vector<nlohmann::ordered_json> imports;
};

// `baseline` overrides the sweep's baseline (a candidate id or label). Throws Error(kUsage) for a folder without
// records or an unknown baseline.
ReportData load_report(const std::string& run_dir, const std::string& baseline = "");

std::string render_markdown(const ReportData& data);
std::string render_html(const ReportData& data);
std::string summary_csv(const ReportData& data);

// summary.csv, report.md and report.html into the run folder.
void write_reports(const std::string& run_dir);

// Shared by the renderers.
std::string format_number(double v);  // 3 significant digits below 100, else no decimals ("0.123", "45.6", "1234")
std::string format_change(double from, double to);  // "+12.3%", "-4.0%", "n/a"
// `to` against `from` on the goal over their repeats (the change of the means): "means +8.4%, 95% CI [+2.1%, +14.7%], significant" or "..., within
// noise"; "" when either has fewer than two repeats at its scored level (no estimate of noise).
std::string noise_text(const ReportData& data, const std::string& from, const std::string& to, const tuner::Goal& goal);
std::string settings_text(const nlohmann::ordered_json& settings, const std::vector<std::string>& dims);
// " (imported)" for a candidate whose results came from `servetune import`, else "".
std::string source_mark(const ReportData& data, const std::string& candidate);
// Command lines that reproduce a candidate on a workload (empty when the data cannot say, e.g. imported records).
std::vector<std::string> reproduce_commands(const ReportData& data, const std::string& candidate);

}  // namespace servetune::report
