// Inline SVG charts for the HTML report, with no scripts or external resources: a bar chart (one bar per
// category) and an x-y chart (points and/or lines per series, optional log2 x axis), with nice axis ticks.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace servetune::report {

struct Bar {
  std::string label;
  double value = 0.0;
  std::string color;
  std::optional<std::pair<double, double>> whisker;  // an interval drawn over the bar (low, high)
};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
  std::string color;
  bool line = true;    // connect the points
  bool dots = true;    // draw the points
  bool dashed = false;
  std::vector<std::string> point_labels;  // optional, one per point
};

std::string bar_chart(const std::string& title, const std::string& y_label, const std::vector<Bar>& bars);
std::string xy_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                     const std::vector<Series>& series, bool log2_x = false);

// The i-th color of a fixed palette.
std::string palette(size_t i);
std::string html_escape(const std::string& s);
// Axis ticks covering [lo, hi]: about `n` round values (1, 2, 5 x 10^k steps).
std::vector<double> nice_ticks(double lo, double hi, int n = 5);

}  // namespace servetune::report
