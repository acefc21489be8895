// Results as the report, the check and the strategies read them: one row per candidate (settings, status, failure
// reason), one cell per (candidate, workload) with every numeric metric's median over repeats, and the objective
// score of a candidate (its metric on the objective workload, or the best SLO-feasible level of a workload group).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuner/noise.h"

namespace servetune::tuner {

struct CandidateRow {
  std::string id;
  std::string label;
  std::string status = "ok";  // ok | partial | failed | skipped
  std::string failure;        // did_not_start | crashed | oom | timed_out (failed), or empty
  std::string reason;         // why skipped / failed
  std::string source = "measured";  // measured | imported | file
  std::string engine;         // builtin, or the server's name
  std::string command;        // launch command of an external server
  std::string log;            // server log (external), relative to the run folder
  nlohmann::ordered_json settings = nlohmann::ordered_json::object();
  nlohmann::ordered_json full_settings = nlohmann::ordered_json::object();
};

struct Cell {
  nlohmann::ordered_json workload;                 // the record's workload description
  std::map<std::string, double> metrics;           // median over repeats
  std::map<std::string, std::vector<double>> samples;  // one value per repeat
  int repeats = 0;
};

class ResultsTable {
 public:
  static ResultsTable build(const std::vector<nlohmann::ordered_json>& records,
                            const std::vector<nlohmann::ordered_json>& trials = {});

  const std::vector<CandidateRow>& candidates() const { return candidates_; }
  const std::vector<std::string>& workloads() const { return workloads_; }  // first-seen order
  const CandidateRow* candidate(const std::string& id) const;
  const Cell* cell(const std::string& candidate, const std::string& workload) const;
  std::optional<double> metric(const std::string& candidate, const std::string& workload, const std::string& key) const;
  // The workloads of a group (concurrency / rate levels), or {name} for a plain workload.
  std::vector<std::string> group(const std::string& name) const;
  std::vector<std::string> groups() const;  // group names, first-seen order
  // Orders workloads as `order` names them (unknown ones keep their place at the end).
  void order_workloads(const std::vector<std::string>& order);

 private:
  std::vector<CandidateRow> candidates_;
  std::vector<std::string> workloads_;
  std::map<std::pair<std::string, std::string>, Cell> cells_;
};

// What "best" means: a metric to maximise or minimise on a workload group, under SLO upper bounds.
struct Goal {
  std::string workload;  // a group or a workload
  std::string metric = "total_token_throughput";
  bool maximize = true;
  std::map<std::string, double> slo;
  // A level whose requests failed beyond this fraction (median over repeats) is infeasible. Fixed levels never get
  // there (such a run fails its trial); an SLA search records the level and searches below it.
  double max_failed_fraction = 1.0;
  // Ranks candidates whose values tie (max_load_under_slo: the goodput at the same highest load); higher is better.
  std::string tiebreak;
};

struct Score {
  bool measured = false;
  bool feasible = false;
  double value = 0.0;
  double tiebreak = 0.0;  // the goal's tiebreak metric at that level
  std::string workload;   // the level the value comes from
  std::string violation;  // "p99_tpot_ms 61.2 > 50" when infeasible
};

// A candidate whose trial failed scores as unmeasured (whatever records it left).
Score score(const ResultsTable& table, const std::string& candidate, const Goal& goal);
// Measured beats unmeasured, feasible beats infeasible, then the better value, then the higher tiebreak.
bool better(const Score& a, const Score& b, bool maximize);
// The best of `ids` (ties: earlier in `ids`); nullopt when none is measured.
std::optional<std::string> best_of(const ResultsTable& table, const std::vector<std::string>& ids, const Goal& goal);

// `challenger` against `incumbent` on the goal's metric, each at its scored level, over their repeats; nullopt
// when either is unmeasured or has fewer than two repeats there (no estimate of noise).
std::optional<MeanDifference> compare_scores(const ResultsTable& table, const std::string& incumbent,
                                             const std::string& challenger, const Goal& goal);
// Whether `challenger` should replace `incumbent`: better by score, and, when repeats give an estimate of noise,
// better beyond it (the interval of the change excludes zero in the goal's direction).
bool beats_beyond_noise(const ResultsTable& table, const std::string& incumbent, const std::string& challenger,
                        const Goal& goal);

double median(std::vector<double> v);
// A record's `offered_load` (a derived metric of every cell): its workload's request rate when finite, else its
// max_concurrency; nullopt for a workload with neither (all requests at once).
std::optional<double> offered_load(const nlohmann::ordered_json& workload);

}  // namespace servetune::tuner
