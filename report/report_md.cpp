// The Markdown report (see report.h): conclusion first, then baseline vs best, stage gains, candidates.
#include <cmath>
#include <sstream>

#include "report/report.h"
#include "tuner/noise.h"

namespace servetune::report {

using namespace tuner;  // records, results tables, specs and command lines are the tuner's
namespace {

std::string metric_cell(const ReportData& d, const std::string& c, const std::string& w, const std::string& key) {
  const auto v = d.table.metric(c, w, key);
  return v ? format_number(*v) : "-";
}

// The 95% confidence interval of the mean of `key` over the repeats ("[1.2e3, 1.4e3]"), or "-" below two repeats.
std::string interval_cell(const ReportData& d, const std::string& c, const std::string& w, const std::string& key) {
  const Cell* cell = d.table.cell(c, w);
  if (cell == nullptr || !cell->samples.count(key)) return "-";
  const auto ci = mean_interval(cell->samples.at(key));
  return ci ? "[" + format_number(ci->low) + ", " + format_number(ci->high) + "]" : "-";
}

// Whether some candidate has repeats of `key` on `w` (then the tables show intervals).
bool has_repeats(const ReportData& d, const std::string& w, const std::string& key) {
  for (const auto& c : d.table.candidates()) {
    const Cell* cell = d.table.cell(c.id, w);
    if (cell != nullptr && cell->samples.count(key) && cell->samples.at(key).size() >= 2) return true;
  }
  return false;
}

std::string workload_caption(const Cell& cell) {
  const auto& w = cell.workload;
  std::string s = w.value("dataset", std::string("?"));
  if (w.contains("num_prompts")) s += ", " + w["num_prompts"].dump() + " prompts";
  if (w.value("dataset", std::string()) == "random") {
    // A multi-turn length distribution stands in for its plain key.
    const auto len = [&](const std::string& key) {
      if (w.contains(key)) return w[key].dump();
      const auto mt = w.find("multi_turn");
      return mt != w.end() && mt->is_object() && mt->contains(key + "_dist") ? (*mt)[key + "_dist"].get<std::string>() : "?";
    };
    s += ", " + len("input_len") + " in / " + len("output_len") + " out";
  }
  if (w.contains("max_concurrency") && !w["max_concurrency"].is_null()) s += ", max concurrency " + w["max_concurrency"].dump();
  if (w.contains("request_rate") && w["request_rate"] != "inf" && !w["request_rate"].is_null()) s += ", " + w["request_rate"].dump() + " req/s";
  return s;
}

const Cell* any_cell(const ReportData& d, const std::string& w) {
  for (const auto& c : d.table.candidates()) {
    if (const Cell* cell = d.table.cell(c.id, w)) return cell;
  }
  return nullptr;
}

std::string label_of(const ReportData& d, const std::string& id) {
  const CandidateRow* c = d.table.candidate(id);
  return c == nullptr ? id : settings_text(c->settings, d.dims);
}

// Whether the conclusion is more than noise: the best against the baseline and against the runner-up, over the
// repeats (Welch's t-test); with one repeat, that nothing can be said.
void significance(std::ostringstream& o, const ReportData& d) {
  std::string runner_up;
  Score runner_score;
  for (const auto& c : d.table.candidates()) {
    if (c.id == d.best) continue;
    const Score s = score(d.table, c.id, d.goal);
    if (s.measured && (runner_up.empty() || better(s, runner_score, d.goal.maximize))) {
      runner_up = c.id;
      runner_score = s;
    }
  }
  if (runner_up.empty()) return;
  const std::string vs_base = d.baseline.empty() || d.baseline == d.best ? "" : noise_text(d, d.baseline, d.best, d.goal);
  const std::string vs_runner = noise_text(d, runner_up, d.best, d.goal);
  if (vs_base.empty() && vs_runner.empty()) {
    o << "*Noise:* each candidate has fewer than two repeats on the deciding workload, so these differences come "
         "with no estimate of noise; `repeat: 3` (or more) tells which of them are real.\n\n";
    return;
  }
  o << "*Noise* (Welch's t-test over the repeats):";
  if (!vs_base.empty()) o << " the best against the baseline: " << vs_base << ";";
  if (!vs_runner.empty()) {
    o << " against the runner-up `" << runner_up << "` (" << label_of(d, runner_up) << "): " << vs_runner;
    if (vs_runner.find("within noise") != std::string::npos) o << ": these repeats cannot tell the two apart";
    o << ".";
  }
  o << "\n\n";
}

void conclusion(std::ostringstream& o, const ReportData& d) {
  o << "## Conclusion\n\n";
  if (d.best.empty()) {
    o << "No candidate produced a measurement; see the candidate table for the reasons.\n\n";
    return;
  }
  const Score best = score(d.table, d.best, d.goal);
  const Score base = d.baseline.empty() ? Score{} : score(d.table, d.baseline, d.goal);
  o << "**Best: `" << d.best << "`**" << source_mark(d, d.best) << " (" << label_of(d, d.best) << "): **" << format_number(best.value) << "** "
    << d.goal.metric << " on `" << best.workload << "`";
  if (!d.goal.tiebreak.empty()) {  // max_load_under_slo: the load it sustains, and what it delivers there
    o << " (the highest load within the SLOs; " << d.goal.tiebreak << " there " << format_number(best.tiebreak) << ")";
  }
  if (base.measured && d.baseline != d.best) {
    o << ", **" << format_change(base.value, best.value) << "** over the baseline `" << d.baseline << "`" << source_mark(d, d.baseline) << " ("
      << label_of(d, d.baseline) << ": " << format_number(base.value) << ")";
  } else if (d.baseline == d.best) {
    o << "; the baseline itself is the best candidate";
  } else if (!d.baseline.empty()) {
    const CandidateRow* b = d.table.candidate(d.baseline);
    o << "; the baseline `" << d.baseline << "` has no measurement to compare with";
    if (b != nullptr && (b->status == "failed" || b->status == "skipped")) {
      o << " (" << b->status << (b->failure.empty() ? "" : ", " + b->failure) << ")";
    }
  }
  o << ".";
  if (!d.goal.slo.empty()) {
    o << (best.feasible ? " Meets every SLO (" : " **No candidate meets the SLOs** (");
    bool first = true;
    for (const auto& [k, v] : d.goal.slo) {
      o << (first ? "" : ", ") << k << " <= " << format_number(v);
      first = false;
    }
    o << (best.feasible ? ")." : "); shown is the best regardless.");
  }
  o << "\n\n";
  significance(o, d);
  const auto cmds = reproduce_commands(d, d.best);
  if (!cmds.empty()) {
    o << "Reproduce it:\n\n```bash\n";
    for (const auto& c : cmds) o << c << "\n";
    o << "```\n\n";
  } else if (const CandidateRow* c = d.table.candidate(d.best)) {
    o << "Settings: `" << c->settings.dump() << "`\n\n";
  }
}

void baseline_vs_best(std::ostringstream& o, const ReportData& d) {
  if (d.best.empty() || d.baseline.empty()) return;
  o << "## Baseline vs best\n\n";
  o << "Baseline `" << d.baseline << "`" << source_mark(d, d.baseline) << " (" << label_of(d, d.baseline) << ") against best `"
    << d.best << "`" << source_mark(d, d.best) << " (" << label_of(d, d.best)
    << "). TPS is total tokens (input + output) per second; TPOT excludes the first token.\n\n";
  o << "| workload | baseline TPS | best TPS | TPS change | baseline output tok/s | best output tok/s | baseline mean TPOT (ms) | best mean TPOT (ms) | TPOT change |\n";
  o << "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& w : d.table.workloads()) {
    const auto bt = d.table.metric(d.baseline, w, "total_token_throughput"), xt = d.table.metric(d.best, w, "total_token_throughput");
    const auto bo = d.table.metric(d.baseline, w, "output_throughput"), xo = d.table.metric(d.best, w, "output_throughput");
    const auto bp = d.table.metric(d.baseline, w, "mean_tpot_ms"), xp = d.table.metric(d.best, w, "mean_tpot_ms");
    if (!bt && !xt) continue;
    auto f = [](const std::optional<double>& v) { return v ? format_number(*v) : std::string("-"); };
    o << "| " << w << " | " << f(bt) << " | " << f(xt) << " | " << (bt && xt ? format_change(*bt, *xt) : "n/a") << " | " << f(bo)
      << " | " << f(xo) << " | " << f(bp) << " | " << f(xp) << " | " << (bp && xp ? format_change(*bp, *xp) : "n/a") << " |\n";
  }
  o << "\n";
}

void stage_gains(std::ostringstream& o, const ReportData& d) {
  if (d.stages.empty()) return;
  o << "## Gain per stage\n\n";
  o << "Objective: " << (d.goal.maximize ? "max " : "min ") << d.goal.metric << " on `" << d.goal.workload << "`";
  for (const auto& [k, v] : d.goal.slo) o << ", " << k << " <= " << format_number(v);
  o << ".\n\n| stage | varied | candidates | leader before | winner | before | after | stage gain | vs baseline |\n";
  o << "|---|---|---:|---|---|---:|---:|---:|---:|\n";
  const Score base = d.baseline.empty() ? Score{} : score(d.table, d.baseline, d.goal);
  for (const auto& st : d.stages) {
    Goal g = d.goal;
    g.workload = st.workload;
    const Score before = score(d.table, st.incumbent, g), after = score(d.table, st.winner, g);
    std::string dims;
    for (const auto& x : st.dims) dims += (dims.empty() ? "" : ", ") + x;
    if (st.kept > 0) dims = "screening on " + st.workload + ", kept " + std::to_string(st.kept);
    const Score after_full = score(d.table, st.winner, d.goal);
    o << "| " << st.name << " | " << (dims.empty() ? "-" : dims) << " | " << st.candidates.size() << " | `" << st.incumbent
      << "` | `" << (st.winner.empty() ? "-" : st.winner) << "` | " << (before.measured ? format_number(before.value) : "-")
      << " | " << (after.measured ? format_number(after.value) : "-") << " | "
      << (before.measured && after.measured ? format_change(before.value, after.value) : "n/a") << " | "
      << (base.measured && after_full.measured && st.kept == 0 ? format_change(base.value, after_full.value) : "n/a") << " |\n";
  }
  o << "\n";
  // Which stage decisions are more than noise (staged strategies promote only beyond it).
  std::string notes;
  for (const auto& st : d.stages) {
    Goal g = d.goal;
    g.workload = st.workload;
    if (!st.not_promoted.empty()) {
      notes += "- " + st.name + ": `" + st.not_promoted + "` measured best, but its lead over `" + st.incumbent +
               "` was within noise (" + noise_text(d, st.incumbent, st.not_promoted, g) + "), so `" + st.incumbent +
               "` stayed.\n";
    } else if (!st.winner.empty() && st.winner != st.incumbent) {
      const std::string n = noise_text(d, st.incumbent, st.winner, g);
      if (!n.empty()) notes += "- " + st.name + ": `" + st.winner + "` over `" + st.incumbent + "`: " + n + ".\n";
    }
  }
  if (!notes.empty()) o << notes << "\n";
}

void candidate_tables(std::ostringstream& o, const ReportData& d) {
  o << "## Candidates\n\n";
  for (const auto& w : d.table.workloads()) {
    const Cell* any = any_cell(d, w);
    if (any == nullptr) continue;
    // With repeats the values are medians, and total tok/s also gets the 95% interval of its mean.
    const bool intervals = has_repeats(d, w, "total_token_throughput");
    // The sweep's accuracy guard (accuracy.h): perplexity and KL against the baseline beside the speed.
    bool accuracy = false;
    for (const auto& c : d.table.candidates()) accuracy = accuracy || d.table.metric(c.id, w, "kl_vs_baseline").has_value();
    o << "### `" << w << "` (" << workload_caption(*any) << ")\n\n| candidate |";
    for (const auto& dim : d.dims) o << " " << dim << " |";
    o << " req/s | output tok/s | total tok/s |" << (intervals ? " total tok/s, 95% CI of the mean |" : "")
      << " mean TTFT (ms) | mean TPOT (ms) | p99 TPOT (ms) | failed |"
      << (accuracy ? " perplexity | KL vs baseline (mean / p99) |" : "") << " SLO |\n|---|";
    for (size_t i = 0; i < d.dims.size(); ++i) o << "---|";
    o << "---:|---:|---:|" << (intervals ? "---:|" : "") << "---:|---:|---:|---:|" << (accuracy ? "---:|---:|" : "") << "---|\n";
    for (const auto& c : d.table.candidates()) {
      if (d.table.cell(c.id, w) == nullptr) continue;
      std::string mark = c.id == d.best ? " (best)" : (c.id == d.baseline ? " (baseline)" : "");
      mark += source_mark(d, c.id);
      o << "| `" << c.id << "`" << mark << " |";
      for (const auto& dim : d.dims) {
        const auto& v = c.settings.contains(dim) ? c.settings[dim] : nlohmann::ordered_json("-");
        o << " " << (v.is_string() ? v.get<std::string>() : v.dump()) << " |";
      }
      Goal g = d.goal;
      g.workload = w;
      const Score s = score(d.table, c.id, g);
      o << " " << metric_cell(d, c.id, w, "request_throughput") << " | " << metric_cell(d, c.id, w, "output_throughput") << " | "
        << metric_cell(d, c.id, w, "total_token_throughput") << " | "
        << (intervals ? interval_cell(d, c.id, w, "total_token_throughput") + " | " : "") << metric_cell(d, c.id, w, "mean_ttft_ms") << " | "
        << metric_cell(d, c.id, w, "mean_tpot_ms") << " | " << metric_cell(d, c.id, w, "p99_tpot_ms") << " | "
        << metric_cell(d, c.id, w, "failed") << " | ";
      if (accuracy) {
        const auto kl = d.table.metric(c.id, w, "kl_vs_baseline"), p99 = d.table.metric(c.id, w, "kl_p99_vs_baseline");
        char buf[64] = "-";
        if (kl && p99) std::snprintf(buf, sizeof(buf), "%.4g / %.4g", *kl, *p99);
        o << metric_cell(d, c.id, w, "perplexity") << " | " << buf << " | ";
      }
      o << (d.goal.slo.empty() ? "-" : (s.feasible ? "ok" : s.violation)) << " |\n";
    }
    o << "\n";
  }
  bool header = false;
  for (const auto& c : d.table.candidates()) {
    if (c.status != "skipped" && c.status != "failed") continue;
    if (!header) {
      o << "### Skipped and failed candidates\n\n| candidate | settings | status | reason |\n|---|---|---|---|\n";
      header = true;
    }
    std::string reason = c.reason;
    for (char& ch : reason) ch = ch == '\n' || ch == '|' ? ' ' : ch;
    if (reason.size() > 300) reason = reason.substr(0, 300) + "...";
    o << "| `" << c.id << "` | " << settings_text(c.settings, d.dims) << " | " << c.status
      << (c.failure.empty() ? "" : " (" + c.failure + ")") << " | " << reason << (c.log.empty() ? "" : " (log: " + c.log + ")") << " |\n";
  }
  if (header) o << "\n";
}

// Where each imported record came from, so its numbers can be traced back to the tool's output.
void imported_sources(std::ostringstream& o, const ReportData& d) {
  if (d.imports.empty()) return;
  o << "## Imported results\n\n";
  o << "Records marked (imported) were not measured by servetune: `servetune import` read them from another tool's output "
       "(numbers as that tool reported them, mapped onto vLLM's metric names).\n\n";
  o << "| candidate | workload | repeat | format | source |\n|---|---|---:|---|---|\n";
  for (const auto& i : d.imports) {
    std::string where = i.value("file", std::string()) + ":" + std::to_string(i.value("line", 0));
    const std::string loc = i.value("locator", std::string());
    if (!loc.empty() && loc.rfind("line ", 0) != 0) where += " (" + loc + ")";
    for (char& ch : where) ch = ch == '|' ? '/' : ch;
    o << "| `" << i.value("candidate", std::string()) << "` | `" << i.value("workload", std::string()) << "` | "
      << i.value("repeat", 0) << " | " << i.value("format", std::string()) << " | " << where << " |\n";
  }
  o << "\n";
}

void environment(std::ostringstream& o, const ReportData& d) {
  o << "## Method and environment\n\n";
  o << "Metrics follow `vllm bench serve`'s definitions; each value is the median over " << d.repeat
    << " repeat(s). Regenerate this report with `servetune report " << d.run_dir << "`.\n\n";
  const auto& e = d.environment;
  if (e.is_object()) {
    auto v = [&](const char* k) { return e.contains(k) && !e[k].is_null() ? (e[k].is_string() ? e[k].get<std::string>() : e[k].dump()) : std::string("-"); };
    o << "| | |\n|---|---|\n| CPU | " << v("cpu_model") << " (" << v("logical_cpus") << " logical) |\n";
    if (e.contains("engine_cpu_isa")) o << "| built-in engine's CPU kernels | " << v("engine_cpu_isa") << " |\n";
    o << "| OS | " << v("os") << " |\n| servetune | " << v("servetune_version") << " |\n| git commit | "
      << v("git_commit") << (e.value("git_dirty", false) ? " (with local changes)" : "") << " |\n\n";
  }
}

}  // namespace

std::string render_markdown(const ReportData& d) {
  std::ostringstream o;
  o << "# Tuning report: " << d.title << "\n\n";
  if (!d.description.empty()) o << d.description << "\n\n";
  conclusion(o, d);
  baseline_vs_best(o, d);
  stage_gains(o, d);
  candidate_tables(o, d);
  imported_sources(o, d);
  environment(o, d);
  return o.str();
}

}  // namespace servetune::report
