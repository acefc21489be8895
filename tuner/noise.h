// Noise in repeated measurements: the Student-t interval of a mean over repeats, and Welch's t-test between two
// candidates' repeats, so a report can say whether a difference is real and a strategy can refuse to promote a
// challenger whose lead is within noise. Pure functions; no interval exists below two samples per side.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

namespace servetune::tuner {

struct MeanInterval {
  double mean = 0.0;
  double low = 0.0;  // the confidence interval of the mean
  double high = 0.0;
  size_t n = 0;
};

// nullopt with fewer than two samples.
std::optional<MeanInterval> mean_interval(const std::vector<double>& samples, double confidence = 0.95);

// b against a: the relative change of the means (b - a) / a with the confidence interval of the difference of the
// means (Welch, unequal variances) divided by a's mean, and the two-sided p-value of "no difference".
struct MeanDifference {
  double change = 0.0;
  double low = 0.0;
  double high = 0.0;
  double p_value = 1.0;
  size_t n_a = 0;
  size_t n_b = 0;
  bool significant() const { return low > 0.0 || high < 0.0; }  // the interval excludes "no change"
};

// nullopt when either side has fewer than two samples or a's mean is 0.
std::optional<MeanDifference> compare_means(const std::vector<double>& a, const std::vector<double>& b,
                                            double confidence = 0.95);

// How far the mean of `new_samples` fresh measurements may stray from the mean of `baseline` by noise alone: the
// half-width of the prediction interval t(1 - (1 - confidence) / 2, n - 1) * s * sqrt(1/n + 1/new_samples) from the
// baseline's own spread. nullopt with fewer than two baseline samples.
std::optional<double> noise_allowance(const std::vector<double>& baseline, size_t new_samples, double confidence = 0.99);

// Student's t distribution with `dof` degrees of freedom (dof > 0, not necessarily an integer).
double student_t_cdf(double t, double dof);
double student_t_quantile(double p, double dof);  // 0 < p < 1

}  // namespace servetune::tuner
