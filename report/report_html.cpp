// The self-contained HTML report (see report.h): the Markdown report's sections converted to HTML, plus inline SVG
// charts: throughput per candidate per workload, throughput vs TPOT with the Pareto front, and throughput and
// TPOT vs concurrency for workloads swept over max_concurrency.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>

#include "report/report.h"
#include "report/svg_chart.h"
#include "tuner/noise.h"

namespace servetune::report {

using namespace tuner;  // records, results tables, specs and command lines are the tuner's
namespace {

// Inline Markdown of the report: `code`, **bold**.
std::string inline_md(const std::string& s) {
  std::string out;
  bool code = false, bold = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') {
      out += code ? "</code>" : "<code>";
      code = !code;
    } else if (!code && s.compare(i, 2, "**") == 0) {
      out += bold ? "</strong>" : "<strong>";
      bold = !bold;
      ++i;
    } else {
      out += html_escape(std::string(1, s[i]));
    }
  }
  if (code) out += "</code>";
  if (bold) out += "</strong>";
  return out;
}

std::vector<std::string> split_row(const std::string& line) {
  std::vector<std::string> cells;
  std::string cur;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '|') {
      const size_t b = cur.find_first_not_of(' '), e = cur.find_last_not_of(' ');
      cells.push_back(b == std::string::npos ? "" : cur.substr(b, e - b + 1));
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  return cells;
}

// The subset of Markdown render_markdown writes: headings, paragraphs, tables, fenced code.
std::string md_to_html(const std::string& md) {
  std::istringstream in(md);
  std::ostringstream o;
  std::string line;
  bool in_code = false, in_table = false, header_row = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      o << (in_code ? "</pre>\n" : "<pre>");
      in_code = !in_code;
      continue;
    }
    if (in_code) {
      o << html_escape(line) << "\n";
      continue;
    }
    if (!line.empty() && line[0] == '|') {
      if (!in_table) {
        o << "<table>\n";
        in_table = header_row = true;
      }
      if (line.find("---") != std::string::npos && line.find_first_not_of("|-: ") == std::string::npos) continue;
      o << "<tr>";
      for (const auto& c : split_row(line)) {
        const bool num = !c.empty() && (std::isdigit(static_cast<unsigned char>(c[0])) || c[0] == '+' || c[0] == '-');
        o << (header_row ? "<th>" : (num ? "<td class=\"n\">" : "<td>")) << inline_md(c) << (header_row ? "</th>" : "</td>");
      }
      o << "</tr>\n";
      header_row = false;
      continue;
    }
    if (in_table) {
      o << "</table>\n";
      in_table = false;
    }
    if (line.rfind("### ", 0) == 0) {
      o << "<h3>" << inline_md(line.substr(4)) << "</h3>\n";
    } else if (line.rfind("## ", 0) == 0) {
      o << "<h2>" << inline_md(line.substr(3)) << "</h2>\n";
    } else if (line.rfind("# ", 0) == 0) {
      o << "<h1>" << inline_md(line.substr(2)) << "</h1>\n";
    } else if (!line.empty()) {
      o << "<p>" << inline_md(line) << "</p>\n";
    }
  }
  if (in_table) o << "</table>\n";
  if (in_code) o << "</pre>\n";
  return o.str();
}

std::string color_for(const ReportData& d, const std::string& id, size_t i) {
  if (id == d.best) return "#2ca02c";
  if (id == d.baseline) return "#7f7f7f";
  return i % 2 == 0 ? "#1f77b4" : "#4a98c9";
}

// A candidate's name in charts: "id*" when its results were imported (explained above the charts).
std::string chart_label(const ReportData& d, const std::string& id) { return id + (source_mark(d, id).empty() ? "" : "*"); }

bool has_levels(const ReportData& d, const std::string& group) { return d.table.group(group).size() > 1; }

std::string charts(const ReportData& d) {
  std::ostringstream o;
  o << "<h2>Charts</h2>\n";
  if (!d.imports.empty()) o << "<p>* imported from another tool's output (<code>servetune import</code>), not measured here.</p>\n";
  // Throughput per candidate, one chart per workload without levels.
  for (const auto& g : d.table.groups()) {
    if (has_levels(d, g)) continue;
    std::vector<Bar> bars;
    size_t i = 0;
    bool whiskers = false;
    for (const auto& c : d.table.candidates()) {
      const auto v = d.table.metric(c.id, g, "total_token_throughput");
      if (!v || bars.size() >= 60) continue;
      bars.push_back({chart_label(d, c.id), *v, color_for(d, c.id, i++), std::nullopt});
      const Cell* cell = d.table.cell(c.id, g);
      if (cell != nullptr && cell->samples.count("total_token_throughput")) {
        if (const auto ci = tuner::mean_interval(cell->samples.at("total_token_throughput"))) {
          bars.back().whisker = std::pair{ci->low, ci->high};
          whiskers = true;
        }
      }
    }
    const std::string title = "Total token throughput on " + g + (whiskers ? " (median; whiskers: 95% interval of the mean)" : "");
    if (!bars.empty()) o << "<figure>" << bar_chart(title, "tokens/s", bars) << "</figure>\n";
  }
  // Throughput vs TPOT on the objective workload, with the Pareto front.
  if (!d.goal.workload.empty()) {
    struct P {
      double tpot, tps;
      std::string id;
    };
    std::vector<P> pts;
    for (const auto& c : d.table.candidates()) {
      for (const auto& w : d.table.group(d.goal.workload)) {
        const auto t = d.table.metric(c.id, w, "mean_tpot_ms"), x = d.table.metric(c.id, w, "total_token_throughput");
        const std::string id = chart_label(d, c.id);
        if (t && x) pts.push_back({*t, *x, has_levels(d, d.goal.workload) ? id + "@" + w.substr(w.find('@') + 1) : id});
      }
    }
    if (!pts.empty()) {
      std::sort(pts.begin(), pts.end(), [](const P& a, const P& b) { return a.tpot < b.tpot || (a.tpot == b.tpot && a.tps > b.tps); });
      Series all{"candidates", {}, "#1f77b4", false, true, false, {}};
      Series front{"Pareto front", {}, "#d62728", true, true, true, {}};
      double best = -1.0;
      for (const auto& p : pts) {
        all.points.push_back({p.tpot, p.tps});
        all.point_labels.push_back(pts.size() <= 24 ? p.id : "");
        if (p.tps > best) {
          front.points.push_back({p.tpot, p.tps});
          best = p.tps;
        }
      }
      o << "<figure>" << xy_chart("Throughput vs TPOT on " + d.goal.workload, "mean TPOT (ms)", "total tokens/s", {all, front}) << "</figure>\n";
    }
  }
  // Throughput and latency against the load (concurrency or request rate levels, listed or searched), and
  // throughput against latency per candidate, with the SLO on the latency plotted (the first SLO on a latency, else
  // mean TPOT without a line).
  std::string latency = "mean_tpot_ms";
  std::optional<double> bound;
  for (const auto& [key, value] : d.goal.slo) {
    if (key.size() > 3 && key.compare(key.size() - 3, 3, "_ms") == 0) {
      latency = key;
      bound = value;
      break;
    }
  }
  for (const auto& g : d.table.groups()) {
    if (!has_levels(d, g)) continue;
    std::vector<Series> tps, lat, curve;
    size_t i = 0;
    bool by_rate = false;
    for (const auto& c : d.table.candidates()) {
      Series a{chart_label(d, c.id), {}, palette(i), true, true, false, {}}, b = a, t = a;
      for (const auto& w : d.table.group(g)) {
        const Cell* cell = d.table.cell(c.id, w);
        if (cell == nullptr) continue;
        const nlohmann::ordered_json& wl = cell->workload;
        double load = 0.0;
        if (wl.contains("max_concurrency") && wl["max_concurrency"].is_number()) {
          load = wl["max_concurrency"].get<double>();
        } else if (wl.contains("request_rate") && wl["request_rate"].is_number() && std::isfinite(wl["request_rate"].get<double>())) {
          load = wl["request_rate"].get<double>();
          by_rate = true;
        } else {
          continue;
        }
        const auto v = d.table.metric(c.id, w, "total_token_throughput"), l = d.table.metric(c.id, w, latency);
        if (v) a.points.push_back({load, *v});
        if (l) b.points.push_back({load, *l});
        if (v && l) t.points.push_back({*l, *v});
      }
      if (a.points.empty() || i >= 10) continue;
      ++i;
      std::sort(t.points.begin(), t.points.end());
      tps.push_back(a);
      lat.push_back(b);
      curve.push_back(t);
    }
    if (tps.empty()) continue;
    const std::string load_label = by_rate ? "request rate (req/s)" : "max concurrency";
    if (bound) {
      double lo = lat.front().points.front().first, hi = lo, y_lo = curve.front().points.empty() ? 0.0 : curve.front().points.front().second, y_hi = y_lo;
      for (const auto& s : lat) {
        for (const auto& p : s.points) lo = std::min(lo, p.first), hi = std::max(hi, p.first);
      }
      for (const auto& s : curve) {
        for (const auto& p : s.points) y_lo = std::min(y_lo, p.second), y_hi = std::max(y_hi, p.second);
      }
      lat.push_back({"SLO", {{lo, *bound}, {hi, *bound}}, "#d62728", true, false, true, {}});
      curve.push_back({"SLO", {{*bound, y_lo}, {*bound, y_hi}}, "#d62728", true, false, true, {}});
    }
    o << "<figure>" << xy_chart("Throughput vs " + load_label + " on " + g, load_label, "total tokens/s", tps, !by_rate) << "</figure>\n";
    o << "<figure>" << xy_chart(latency + " vs " + load_label + " on " + g, load_label, latency, lat, !by_rate) << "</figure>\n";
    o << "<figure>" << xy_chart("Throughput vs " + latency + " on " + g + " (one point per load level)", latency, "total tokens/s", curve)
      << "</figure>\n";
  }
  return o.str();
}

constexpr const char* kStyle = R"(body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px}th{background:#f3f3f3}
td.n{text-align:right;font-variant-numeric:tabular-nums}pre{background:#f6f8fa;padding:12px;white-space:pre-wrap;word-break:break-all;font-size:13px}
code{background:#f6f8fa;padding:1px 3px}figure{margin:1em 0}h1{border-bottom:2px solid #2ca02c}svg{max-width:100%;height:auto})";

}  // namespace

std::string render_html(const ReportData& d) {
  const std::string md = render_markdown(d);
  std::string before = md, after;
  const size_t cut = md.find("\n## Candidates");
  if (cut != std::string::npos) {
    before = md.substr(0, cut + 1);
    after = md.substr(cut + 1);
  }
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Tuning report: " << html_escape(d.title)
    << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n"
    << md_to_html(before) << charts(d) << md_to_html(after) << "</body>\n</html>\n";
  return o.str();
}

}  // namespace servetune::report
