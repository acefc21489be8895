// Aggregation of records into candidates and cells, and objective scoring (see results_table.h).
#include "tuner/results_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace servetune::tuner {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::optional<double> offered_load(const nlohmann::ordered_json& workload) {
  const auto rate = workload.find("request_rate");
  if (rate != workload.end() && rate->is_number() && std::isfinite(rate->get<double>())) return rate->get<double>();
  const auto conc = workload.find("max_concurrency");
  if (conc != workload.end() && conc->is_number()) return conc->get<double>();
  return std::nullopt;
}

ResultsTable ResultsTable::build(const std::vector<nlohmann::ordered_json>& records,
                                 const std::vector<nlohmann::ordered_json>& trials) {
  ResultsTable t;
  std::map<std::string, CandidateRow> rows;
  auto row_for = [&](const nlohmann::ordered_json& c) -> CandidateRow& {
    const std::string id = c.at("id").get<std::string>();
    CandidateRow& r = rows[id];
    r.id = id;
    if (r.label.empty()) r.label = c.value("label", id);
    if (c.contains("settings") && r.settings.empty()) r.settings = c["settings"];
    if (c.contains("full_settings") && r.full_settings.empty()) r.full_settings = c["full_settings"];
    if (c.contains("engine") && r.engine.empty()) r.engine = c["engine"].get<std::string>();
    if (c.contains("command") && r.command.empty()) r.command = c["command"].get<std::string>();
    return r;
  };
  for (const auto& tr : trials) {
    CandidateRow& r = row_for(tr.at("candidate_info"));
    const std::string status = tr.value("status", std::string("ok"));
    if (status == "skipped") {
      r.status = "skipped";
      r.reason = tr.value("reason", std::string());
    } else if (status == "failed" && r.status != "failed") {
      r.status = "failed";
      r.failure = tr.value("failure", std::string());
      r.reason = tr.value("reason", std::string());
    }
    if (tr.contains("log") && tr["log"].is_string() && r.log.empty()) r.log = tr["log"].get<std::string>();
  }
  for (const auto& rec : records) {
    CandidateRow& r = row_for(rec.at("candidate"));
    const std::string source = rec.contains("provenance") ? rec["provenance"].value("source", std::string("measured")) : "measured";
    r.source = source;
    const nlohmann::ordered_json& w = rec.at("workload");
    const std::string wname = w.at("name").get<std::string>();
    if (std::find(t.workloads_.begin(), t.workloads_.end(), wname) == t.workloads_.end()) t.workloads_.push_back(wname);
    Cell& cell = t.cells_[{r.id, wname}];
    cell.workload = w;
    ++cell.repeats;
    for (const auto& [k, v] : rec.at("metrics").items()) {
      if (v.is_number()) cell.samples[k].push_back(v.get<double>());
    }
    if (const auto load = offered_load(w)) cell.samples["offered_load"].push_back(*load);
  }
  for (auto& [key, cell] : t.cells_) {
    for (const auto& [k, v] : cell.samples) cell.metrics[k] = median(v);
  }
  // A candidate with a trial that completed, but whose records miss some workloads of a later trial, is partial.
  for (auto& [id, r] : rows) t.candidates_.push_back(r);
  return t;
}

const CandidateRow* ResultsTable::candidate(const std::string& id) const {
  for (const auto& c : candidates_) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

const Cell* ResultsTable::cell(const std::string& candidate, const std::string& workload) const {
  const auto it = cells_.find({candidate, workload});
  return it == cells_.end() ? nullptr : &it->second;
}

std::optional<double> ResultsTable::metric(const std::string& candidate, const std::string& workload, const std::string& key) const {
  const Cell* c = cell(candidate, workload);
  if (c == nullptr) return std::nullopt;
  const auto it = c->metrics.find(key);
  if (it == c->metrics.end()) return std::nullopt;
  return it->second;
}

namespace {
std::string group_of(const ResultsTable& t, const std::string& workload) {
  for (const auto& c : t.candidates()) {
    if (const Cell* cell = t.cell(c.id, workload)) return cell->workload.value("group", workload);
  }
  return workload;
}
}  // namespace

std::vector<std::string> ResultsTable::group(const std::string& name) const {
  std::vector<std::string> out;
  for (const auto& w : workloads_) {
    if (w == name) return {w};
    if (group_of(*this, w) == name) out.push_back(w);
  }
  return out;
}

std::vector<std::string> ResultsTable::groups() const {
  std::vector<std::string> out;
  for (const auto& w : workloads_) {
    const std::string g = group_of(*this, w);
    if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
  }
  return out;
}

void ResultsTable::order_workloads(const std::vector<std::string>& order) {
  std::stable_sort(workloads_.begin(), workloads_.end(), [&](const std::string& a, const std::string& b) {
    const auto ia = std::find(order.begin(), order.end(), a), ib = std::find(order.begin(), order.end(), b);
    return ia < ib;
  });
}

Score score(const ResultsTable& table, const std::string& candidate, const Goal& goal) {
  Score best;
  // A failed trial's records stay in the tables, but it competes as unmeasured: it cannot win, nor lead a stage.
  if (const CandidateRow* row = table.candidate(candidate); row != nullptr && row->status == "failed") {
    best.violation = "its trial failed (" + row->failure + ")";
    return best;
  }
  for (const auto& w : table.group(goal.workload)) {
    const auto v = table.metric(candidate, w, goal.metric);
    if (!v) continue;
    Score s;
    s.measured = true;
    s.value = *v;
    s.workload = w;
    s.feasible = true;
    for (const auto& [k, limit] : goal.slo) {
      const auto m = table.metric(candidate, w, k);
      if (!m || *m > limit) {
        s.feasible = false;
        char buf[160];
        if (m) {
          std::snprintf(buf, sizeof(buf), "%s %.4g > %.4g", k.c_str(), *m, limit);
        } else {
          std::snprintf(buf, sizeof(buf), "%s not measured", k.c_str());
        }
        s.violation = buf;
        break;
      }
    }
    const double completed = table.metric(candidate, w, "completed").value_or(1.0);
    if (completed <= 0.0) {
      s.feasible = false;
      s.violation = "no request completed";
    } else if (const double failed = table.metric(candidate, w, "failed").value_or(0.0);
               failed / (failed + completed) > goal.max_failed_fraction) {
      s.feasible = false;
      char buf[160];
      std::snprintf(buf, sizeof(buf), "%.1f%% of its requests failed", 100.0 * failed / (failed + completed));
      s.violation = buf;
    }
    if (!goal.tiebreak.empty()) s.tiebreak = table.metric(candidate, w, goal.tiebreak).value_or(0.0);
    if (better(s, best, goal.maximize)) best = s;
  }
  return best;
}

bool better(const Score& a, const Score& b, bool maximize) {
  if (a.measured != b.measured) return a.measured;
  if (a.feasible != b.feasible) return a.feasible;
  if (a.value == b.value) return a.tiebreak > b.tiebreak;
  return maximize ? a.value > b.value : a.value < b.value;
}

namespace {

// The goal metric's repeats of two scored candidates, compared; nullopt without two repeats on each side.
std::optional<MeanDifference> compare_scored(const ResultsTable& table, const std::string& a_id, const Score& a,
                                             const std::string& b_id, const Score& b, const Goal& goal) {
  if (!a.measured || !b.measured) return std::nullopt;
  const Cell* ca = table.cell(a_id, a.workload);
  const Cell* cb = table.cell(b_id, b.workload);
  if (ca == nullptr || cb == nullptr || !ca->samples.count(goal.metric) || !cb->samples.count(goal.metric)) return std::nullopt;
  return compare_means(ca->samples.at(goal.metric), cb->samples.at(goal.metric));
}

}  // namespace

std::optional<MeanDifference> compare_scores(const ResultsTable& table, const std::string& incumbent,
                                             const std::string& challenger, const Goal& goal) {
  return compare_scored(table, incumbent, score(table, incumbent, goal), challenger, score(table, challenger, goal), goal);
}

bool beats_beyond_noise(const ResultsTable& table, const std::string& incumbent, const std::string& challenger,
                        const Goal& goal) {
  const Score a = score(table, incumbent, goal), b = score(table, challenger, goal);
  if (!better(b, a, goal.maximize)) return false;
  if (a.feasible != b.feasible || !a.measured) return true;  // feasibility is not a matter of noise
  const auto d = compare_scored(table, incumbent, a, challenger, b, goal);
  if (!d) return true;
  return goal.maximize ? d->low > 0.0 : d->high < 0.0;
}

std::optional<std::string> best_of(const ResultsTable& table, const std::vector<std::string>& ids, const Goal& goal) {
  std::optional<std::string> best;
  Score best_score;
  for (const auto& id : ids) {
    const Score s = score(table, id, goal);
    if (!s.measured) continue;
    if (!best || better(s, best_score, goal.maximize)) {
      best = id;
      best_score = s;
    }
  }
  return best;
}

}  // namespace servetune::tuner
