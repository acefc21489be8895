// SVG charts (see svg_chart.h).
#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "report/report.h"

namespace servetune::report {

using namespace tuner;  // records, results tables, specs and command lines are the tuner's
namespace {

constexpr double kWidth = 720, kHeight = 360, kLeft = 70, kRight = 20, kTop = 34, kBottom = 70;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string tick_text(double v) {
  if (v == 0) return "0";
  char buf[32];
  if (std::fabs(v) >= 10000) {
    std::snprintf(buf, sizeof(buf), "%.0fk", v / 1000);
  } else if (std::fabs(v) >= 1) {
    std::snprintf(buf, sizeof(buf), "%g", std::round(v * 100) / 100);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  }
  return buf;
}

void frame(std::ostringstream& o, const std::string& title, const std::string& x_label, const std::string& y_label) {
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" width=\"" << kWidth
    << "\" height=\"" << kHeight << "\" role=\"img\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<title>" << html_escape(title) << "</title>\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
    << "<text x=\"" << kWidth / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" << html_escape(title) << "</text>\n"
    << "<text x=\"" << kWidth / 2 << "\" y=\"" << kHeight - 6 << "\" text-anchor=\"middle\">" << html_escape(x_label) << "</text>\n"
    << "<text transform=\"translate(14," << (kTop + (kHeight - kTop - kBottom) / 2) << ") rotate(-90)\" text-anchor=\"middle\">"
    << html_escape(y_label) << "</text>\n";
}

void y_axis(std::ostringstream& o, const std::vector<double>& ticks, double lo, double hi) {
  const double h = kHeight - kTop - kBottom;
  for (double t : ticks) {
    const double y = kTop + h - (t - lo) / (hi - lo) * h;
    o << "<line x1=\"" << kLeft << "\" x2=\"" << kWidth - kRight << "\" y1=\"" << num(y) << "\" y2=\"" << num(y)
      << "\" stroke=\"#e0e0e0\"/>\n<text x=\"" << kLeft - 6 << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\">" << tick_text(t) << "</text>\n";
  }
  o << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft << "\" y1=\"" << kTop << "\" y2=\"" << kHeight - kBottom << "\" stroke=\"#333\"/>\n"
    << "<line x1=\"" << kLeft << "\" x2=\"" << kWidth - kRight << "\" y1=\"" << kHeight - kBottom << "\" y2=\"" << kHeight - kBottom
    << "\" stroke=\"#333\"/>\n";
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string palette(size_t i) {
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kColors[i % std::size(kColors)];
}

std::vector<double> nice_ticks(double lo, double hi, int n) {
  if (!(hi > lo)) hi = lo + 1.0;
  const double raw = (hi - lo) / std::max(1, n);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double t = std::floor(lo / step + 1e-9) * step;; t += step) {
    out.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
    if (t >= hi - step * 1e-9) break;
  }
  return out;
}

std::string bar_chart(const std::string& title, const std::string& y_label, const std::vector<Bar>& bars) {
  std::ostringstream o;
  frame(o, title, "", y_label);
  double hi = 0.0;
  for (const auto& b : bars) hi = std::max({hi, b.value, b.whisker ? b.whisker->second : 0.0});
  std::vector<double> ticks = nice_ticks(0.0, hi > 0 ? hi : 1.0);
  hi = ticks.back();
  y_axis(o, ticks, 0.0, hi);
  const double w = kWidth - kLeft - kRight, h = kHeight - kTop - kBottom;
  const double slot = bars.empty() ? w : w / static_cast<double>(bars.size());
  for (size_t i = 0; i < bars.size(); ++i) {
    const double bh = bars[i].value / hi * h;
    const double x = kLeft + slot * static_cast<double>(i) + slot * 0.15;
    o << "<rect x=\"" << num(x) << "\" y=\"" << num(kTop + h - bh) << "\" width=\"" << num(slot * 0.7) << "\" height=\"" << num(bh)
      << "\" fill=\"" << bars[i].color << "\"><title>" << html_escape(bars[i].label) << ": " << format_number(bars[i].value)
      << "</title></rect>\n";
    const double cx = x + slot * 0.35;
    if (const auto& wk = bars[i].whisker) {
      const double y_low = kTop + h - std::max(0.0, wk->first) / hi * h, y_high = kTop + h - wk->second / hi * h;
      o << "<path d=\"M" << num(cx) << " " << num(y_low) << "V" << num(y_high) << "M" << num(cx - slot * 0.12) << " " << num(y_low)
        << "h" << num(slot * 0.24) << "M" << num(cx - slot * 0.12) << " " << num(y_high) << "h" << num(slot * 0.24)
        << "\" stroke=\"#222\" fill=\"none\"><title>" << html_escape(bars[i].label) << ": 95% interval of the mean ["
        << format_number(wk->first) << ", " << format_number(wk->second) << "]</title></path>\n";
    }
    o << "<text transform=\"translate(" << num(cx) << "," << num(kHeight - kBottom + 12) << ") rotate(35)\">" << html_escape(bars[i].label) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string xy_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                     const std::vector<Series>& series, bool log2_x) {
  std::ostringstream o;
  frame(o, title, x_label, y_label);
  double xlo = INFINITY, xhi = -INFINITY, yhi = 0.0;
  const auto fx = [&](double x) { return log2_x ? std::log2(std::max(x, 1e-9)) : x; };
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      xlo = std::min(xlo, fx(x));
      xhi = std::max(xhi, fx(x));
      yhi = std::max(yhi, y);
    }
  }
  if (!std::isfinite(xlo)) xlo = 0, xhi = 1;
  if (xhi == xlo) xlo -= 1, xhi += 1;
  std::vector<double> xt;
  if (log2_x) {
    xlo = std::floor(xlo);
    xhi = std::ceil(xhi);
    for (double e = xlo; e <= xhi + 1e-9; e += 1) xt.push_back(std::pow(2.0, e));
  } else {
    xt = nice_ticks(xlo, xhi);
    xlo = xt.front();
    xhi = xt.back();
  }
  std::vector<double> yt = nice_ticks(0.0, yhi > 0 ? yhi * 1.05 : 1.0);
  const double ylim = yt.back();
  y_axis(o, yt, 0.0, ylim);
  const double w = kWidth - kLeft - kRight, h = kHeight - kTop - kBottom;
  const auto px = [&](double x) { return kLeft + (fx(x) - xlo) / (xhi - xlo) * w; };
  const auto py = [&](double y) { return kTop + h - y / ylim * h; };
  for (double t : xt) {
    o << "<text x=\"" << num(px(t)) << "\" y=\"" << num(kHeight - kBottom + 14) << "\" text-anchor=\"middle\">" << tick_text(t) << "</text>\n";
  }
  for (const auto& s : series) {
    if (s.line && s.points.size() > 1) {
      o << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
      for (const auto& [x, y] : s.points) o << num(px(x)) << "," << num(py(y)) << " ";
      o << "\"/>\n";
    }
    if (s.dots) {
      for (size_t i = 0; i < s.points.size(); ++i) {
        const auto& [x, y] = s.points[i];
        const std::string label = i < s.point_labels.size() ? s.point_labels[i] : s.name;
        o << "<circle cx=\"" << num(px(x)) << "\" cy=\"" << num(py(y)) << "\" r=\"4\" fill=\"" << s.color << "\"><title>"
          << html_escape(label) << ": (" << format_number(x) << ", " << format_number(y) << ")</title></circle>\n";
        if (i < s.point_labels.size()) {
          o << "<text x=\"" << num(px(x) + 6) << "\" y=\"" << num(py(y) - 6) << "\" font-size=\"10\">" << html_escape(s.point_labels[i]) << "</text>\n";
        }
      }
    }
  }
  // Legend along the bottom.
  double lx = kLeft;
  for (const auto& s : series) {
    o << "<rect x=\"" << num(lx) << "\" y=\"" << kHeight - 30 << "\" width=\"10\" height=\"10\" fill=\"" << s.color << "\"/>"
      << "<text x=\"" << num(lx + 14) << "\" y=\"" << kHeight - 21 << "\">" << html_escape(s.name) << "</text>\n";
    lx += 24 + 6.5 * static_cast<double>(s.name.size());
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace servetune::report
