// Loading a run folder for the reports, the summary CSV and the shared formatting (see report.h).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "servetune/error.h"
#include "tuner/command_line.h"
#include "importers/importer.h"
#include "report/report.h"
#include "tuner/results_store.h"
#include "tuner/server_command.h"
#include "tuner/space.h"

namespace servetune::report {

using namespace tuner;  // records, results tables, specs and command lines are the tuner's
namespace fs = std::filesystem;

std::string format_number(double v) {
  char buf[64];
  if (std::fabs(v) >= 100.0 || v == 0.0) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  }
  return buf;
}

std::string format_change(double from, double to) {
  if (from == 0.0 || !std::isfinite(from) || !std::isfinite(to)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%+.1f%%", (to - from) / std::fabs(from) * 100.0);
  return buf;
}

std::string noise_text(const ReportData& d, const std::string& from, const std::string& to, const Goal& goal) {
  const auto diff = compare_scores(d.table, from, to, goal);
  if (!diff) return "";
  char buf[160];
  std::snprintf(buf, sizeof(buf), "means %+.1f%%, 95%% CI [%+.1f%%, %+.1f%%], %s", diff->change * 100.0, diff->low * 100.0,
                diff->high * 100.0, diff->significant() ? "significant" : "within noise");
  return buf;
}

std::string settings_text(const nlohmann::ordered_json& settings, const std::vector<std::string>& dims) {
  std::string out;
  for (const auto& d : dims) {
    if (!settings.contains(d)) continue;
    const auto& v = settings.at(d);
    out += (out.empty() ? "" : ", ") + d + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return out.empty() ? "(defaults)" : out;
}

std::string source_mark(const ReportData& d, const std::string& id) {
  const CandidateRow* c = d.table.candidate(id);
  return c != nullptr && c->source == "imported" ? " (imported)" : "";
}

ReportData load_report(const std::string& run_dir, const std::string& baseline) {
  ReportData d;
  d.run_dir = run_dir;
  ResultsStore store(run_dir);
  // A sweep in which every candidate failed still has its report: the trials say why each failed.
  std::vector<nlohmann::ordered_json> records;
  if (!store.exists() || !store.records().empty()) records = load_records(run_dir);
  std::vector<nlohmann::ordered_json> trials;
  if (store.exists()) trials = store.trials();
  d.table = ResultsTable::build(records, trials);
  for (const auto& r : records) {
    if (d.environment.is_null() && r.contains("provenance") && r["provenance"].contains("environment")) {
      d.environment = r["provenance"]["environment"];
    }
    if (r.contains("provenance") && r["provenance"].value("source", std::string()) == "imported") {
      const auto& p = r["provenance"];
      d.imports.push_back({{"candidate", r["candidate"].value("id", std::string())}, {"workload", r["workload"].value("name", std::string())},
                           {"repeat", r.value("repeat", 0)}, {"format", p.value("format", std::string())},
                           {"file", p.value("file", p.value("path", std::string()))}, {"line", p.value("line", 0)},
                           {"locator", p.value("locator", std::string())}, {"model", p.value("model", nlohmann::ordered_json())}});
    }
  }
  if (store.exists()) {
    const nlohmann::ordered_json stored = store.sweep();
    SpecFile file;
    file.path = stored.value("source", run_dir + "/sweep.json");
    file.root = stored.at("document");
    d.spec = parse_sweep(file);
    const SweepSpec& spec = *d.spec;
    d.title = spec.name;
    d.description = spec.description;
    d.goal = goal_of(spec);
    d.repeat = spec.repeat;
    SearchSpace space(spec);
    std::unique_ptr<Strategy> strategy = Strategy::make(spec, space);
    while (strategy->next(d.table)) {
    }
    d.stages = strategy->stages();
    d.baseline = space.baseline().id;
    std::vector<std::string> order;
    for (const auto& w : spec.workloads) order.push_back(w.name);
    d.table.order_workloads(order);
  } else {
    d.title = fs::path(run_dir).filename().string();
    if (d.title.empty()) d.title = run_dir;
    const importers::ImportManifest imported = importers::read_import_manifest(run_dir);  // a folder built by `servetune import`
    d.table.order_workloads(imported.workloads);
    d.goal.workload = d.table.groups().empty() ? "" : d.table.groups().front();
    if (!d.table.candidates().empty()) d.baseline = d.table.candidates().front().id;
    if (!imported.baseline.empty() && d.table.candidate(imported.baseline) != nullptr) d.baseline = imported.baseline;
  }
  if (!baseline.empty()) {
    d.baseline.clear();
    for (const auto& c : d.table.candidates()) {
      if (c.id == baseline || c.label == baseline) d.baseline = c.id;
    }
    if (d.baseline.empty()) throw_usage("--baseline " + baseline + ": no candidate of " + run_dir + " has that id or label");
  }
  std::vector<std::string> ids;
  for (const auto& c : d.table.candidates()) ids.push_back(c.id);
  d.best = best_of(d.table, ids, d.goal).value_or("");
  std::set<std::string> keys;
  for (const auto& c : d.table.candidates()) {
    for (const auto& [k, v] : c.settings.items()) keys.insert(k);
  }
  const auto& cands = d.table.candidates();
  for (const auto& k : keys) {
    std::set<std::string> values;
    for (const auto& c : cands) values.insert(c.settings.contains(k) ? c.settings[k].dump() : "-");
    if (values.size() > 1) d.dims.push_back(k);
  }
  if (d.spec) {  // the sweep file's order
    std::vector<std::string> ordered;
    for (const auto& dim : d.spec->space) {
      if (std::find(d.dims.begin(), d.dims.end(), dim.name) != d.dims.end()) ordered.push_back(dim.name);
    }
    d.dims = ordered;
  }
  return d;
}

std::vector<std::string> reproduce_commands(const ReportData& d, const std::string& id) {
  const CandidateRow* c = d.table.candidate(id);
  if (c == nullptr || !d.spec) return {};
  const SweepSpec& spec = *d.spec;
  const auto ws = spec.objective_workloads();
  std::string workload = ws.empty() ? "" : bench_flags(ws.front()->to_json());
  const Score s = score(d.table, id, d.goal);
  if (s.measured) {
    if (const Cell* cell = d.table.cell(id, s.workload)) workload = bench_flags(cell->workload);
  }
  const std::string model = shell_quote(spec.target.model);
  if (spec.builtin()) {
    const std::string flags = engine_flags(c->full_settings);
    const std::string sep = flags.empty() ? "" : " ";
    return {"servetune serve --model " + model + sep + flags,
            "servetune bench --backend builtin --model " + model + sep + flags + " " + workload};
  }
  std::string why;
  const int port = spec.target.port == 0 ? 8000 : spec.target.port;
  const auto cmd = render_launch(spec, c->full_settings, port, why);
  if (!cmd) return {};
  const ServerSpec& server = *cmd->server;
  std::string bench = "servetune bench --backend " + server.backend + " --base-url http://" + spec.target.host + ":" +
                      std::to_string(port) + " --model " + model;
  if (!server.served_model_name.empty()) bench += " --served-model-name " + shell_quote(server.served_model_name);
  if (!spec.target.tokenizer.empty()) bench += " --tokenizer " + shell_quote(spec.target.tokenizer);
  return {cmd->command, bench + " " + workload};
}

std::string summary_csv(const ReportData& d) {
  static const char* kMetrics[] = {"completed", "failed", "request_throughput", "output_throughput", "total_token_throughput",
                                   "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "mean_e2el_ms"};
  auto csv = [](std::string s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
  };
  std::string out = "candidate,label,status,failure,reason";
  for (const auto& dim : d.dims) out += "," + csv(dim);
  out += ",workload,max_concurrency,request_rate,repeats";
  for (const char* m : kMetrics) out += std::string(",") + m;
  out += ",feasible,source\n";  // source: measured | imported (servetune import)
  for (const auto& c : d.table.candidates()) {
    std::string head = csv(c.id) + "," + csv(c.label) + "," + c.status + "," + c.failure + "," + csv(c.reason);
    for (const auto& dim : d.dims) {
      head += "," + (c.settings.contains(dim) ? csv(c.settings[dim].is_string() ? c.settings[dim].get<std::string>() : c.settings[dim].dump()) : "");
    }
    bool any = false;
    for (const auto& w : d.table.workloads()) {
      const Cell* cell = d.table.cell(c.id, w);
      if (cell == nullptr) continue;
      any = true;
      const auto text = [](const nlohmann::ordered_json& v) { return v.is_null() ? std::string() : (v.is_string() ? v.get<std::string>() : v.dump()); };
      out += head + "," + csv(w) + "," + text(cell->workload.value("max_concurrency", nlohmann::ordered_json())) + "," +
             text(cell->workload.value("request_rate", nlohmann::ordered_json())) + "," + std::to_string(cell->repeats);
      for (const char* m : kMetrics) {
        const auto it = cell->metrics.find(m);
        char num[32] = "";
        if (it != cell->metrics.end()) std::snprintf(num, sizeof(num), "%.6g", it->second);
        out += std::string(",") + num;
      }
      Goal g = d.goal;
      g.workload = w;
      out += std::string(",") + (score(d.table, c.id, g).feasible ? "yes" : "no") + "," + c.source + "\n";
    }
    if (!any) {
      out += head + ",,,,0";
      for (size_t i = 0; i < std::size(kMetrics); ++i) out += ",";
      out += ",no," + c.source + "\n";
    }
  }
  return out;
}

void write_reports(const std::string& run_dir) {
  const ReportData d = load_report(run_dir);
  write_file_atomic((fs::path(run_dir) / "summary.csv").string(), summary_csv(d));
  write_file_atomic((fs::path(run_dir) / "report.md").string(), render_markdown(d));
  write_file_atomic((fs::path(run_dir) / "report.html").string(), render_html(d));
}

}  // namespace servetune::report
