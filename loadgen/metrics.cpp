// Metric computation mirroring vllm/benchmarks/serve.py calculate_metrics (see metrics.h).
#include "loadgen/metrics.h"

#include <algorithm>
#include <cmath>

namespace servetune::loadgen {

namespace {

// numpy's linear percentile on sorted values.
double percentile_sorted(const std::vector<double>& values, double p) {
  if (values.empty()) return 0.0;
  const double q = p / 100.0;
  const double virtual_index = static_cast<double>(values.size() - 1) * q;
  const double prev = std::floor(virtual_index);
  const size_t lo = static_cast<size_t>(std::clamp(prev, 0.0, static_cast<double>(values.size() - 1)));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double gamma = virtual_index - prev;
  const double a = values[lo], b = values[hi];
  const double diff = b - a;
  // numpy's _lerp: interpolate from the nearer end for accuracy.
  return gamma >= 0.5 ? b - diff * (1.0 - gamma) : a + diff * gamma;
}

}  // namespace

double percentile_linear(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return percentile_sorted(values, p);
}

Summary summarize_ms(const std::vector<double>& values, const std::vector<double>& percentiles) {
  Summary s;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  if (!values.empty()) {
    double sum = 0.0;
    for (double v : values) sum += v;
    const double mean = sum / static_cast<double>(values.size());
    double ss = 0.0;
    for (double v : values) ss += (v - mean) * (v - mean);
    s.mean = mean * 1000.0;
    s.std = std::sqrt(ss / static_cast<double>(values.size())) * 1000.0;
    const size_t n = sorted.size();
    s.median = (n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0) * 1000.0;  // np.median
  }
  for (double p : percentiles) s.percentiles.emplace_back(p, percentile_sorted(sorted, p) * 1000.0);
  return s;
}

std::string failure_reason(const std::string& error) {
  std::string r = error.substr(0, error.find('\n'));
  if (r.size() > 200) r = r.substr(0, 200);
  return r.empty() ? "unknown error" : r;
}

BenchmarkMetrics compute_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                 const std::vector<double>& percentiles, const GoodputSlo& slo,
                                 const std::function<int64_t(const std::string&)>& count_tokens) {
  BenchmarkMetrics m;
  std::vector<double> ttfts, tpots, all_tpots, itls, e2els, read_lags, send_lags, queue_times, e2el_queue,
      per_token_itls;
  for (const RequestOutput& o : outputs) {
    if (o.failure != RequestFailure::kNotSent) send_lags.push_back(std::max(0.0, o.start_time - o.ready_time));
    read_lags.insert(read_lags.end(), o.read_lags.begin(), o.read_lags.end());
    if (!o.success) {
      m.actual_output_lens.push_back(0);
      ++m.failed;
      ++m.failure_reasons[failure_reason(o.error)];
      continue;
    }
    int64_t output_len = o.output_tokens;
    if (output_len == 0) output_len = count_tokens ? count_tokens(o.generated_text) : 1;
    m.actual_output_lens.push_back(output_len);
    m.total_input += o.prompt_len;
    double tpot = 0.0;
    if (output_len > 1) {
      tpot = (o.latency - o.ttft) / static_cast<double>(output_len - 1);
      tpots.push_back(tpot);
    }
    all_tpots.push_back(tpot);
    itls.insert(itls.end(), o.itl.begin(), o.itl.end());
    for (size_t k = 0; k < o.itl.size(); ++k) {
      const int32_t n = k + 1 < o.chunk_tokens.size() ? std::max<int32_t>(o.chunk_tokens[k + 1], 1) : 1;
      for (int32_t t = 0; t < n; ++t) per_token_itls.push_back(o.itl[k] / n);
    }
    ttfts.push_back(o.ttft);
    e2els.push_back(o.latency);
    queue_times.push_back(o.start_time - o.scheduled_time);
    e2el_queue.push_back(o.latency + (o.start_time - o.scheduled_time));
    ++m.completed;
  }
  for (int64_t n : m.actual_output_lens) m.total_output += n;

  if (!slo.empty()) {
    for (size_t i = 0; i < ttfts.size(); ++i) {
      const bool good = (!slo.ttft || *slo.ttft / 1000.0 >= ttfts[i]) &&
                        (!slo.tpot || *slo.tpot / 1000.0 >= all_tpots[i]) &&
                        (!slo.e2el || *slo.e2el / 1000.0 >= e2els[i]);
      if (good) m.request_goodput += 1.0;
    }
    m.request_goodput /= duration_s;
  }

  bool any_success = false;
  double min_start = 0.0, max_end = 0.0;
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    if (!any_success) {
      min_start = o.start_time;
      max_end = o.start_time + o.latency;
      any_success = true;
    }
    min_start = std::min(min_start, o.start_time);
    max_end = std::max(max_end, o.start_time + o.latency);
  }
  if (any_success) {
    const int64_t buckets = static_cast<int64_t>(std::ceil(max_end - min_start)) + 1;
    std::vector<double> per_second(static_cast<size_t>(buckets), 0.0);
    std::vector<std::pair<double, int>> events;
    for (const RequestOutput& o : outputs) {
      if (!o.success) continue;
      double t = o.start_time + o.ttft;
      const auto add = [&](double time) {
        const int64_t b = static_cast<int64_t>(time - min_start);
        if (b >= 0 && b < buckets) per_second[static_cast<size_t>(b)] += 1.0;
      };
      add(t);
      for (double gap : o.itl) {
        t += gap;
        add(t);
      }
      events.emplace_back(o.start_time, 1);
      events.emplace_back(o.start_time + o.latency, -1);
    }
    std::sort(events.begin(), events.end());  // at equal times -1 (end) sorts before +1 (start): [start, end)
    int64_t current = 0;
    for (const auto& e : events) {
      current += e.second;
      m.max_concurrent_requests = std::max(m.max_concurrent_requests, current);
    }
    m.max_output_tokens_per_s = *std::max_element(per_second.begin(), per_second.end());
  }

  m.request_throughput = static_cast<double>(m.completed) / duration_s;
  m.output_throughput = static_cast<double>(m.total_output) / duration_s;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
  m.ttft_ms = summarize_ms(ttfts, percentiles);
  m.tpot_ms = summarize_ms(tpots, percentiles);
  m.itl_ms = summarize_ms(itls, percentiles);
  m.e2el_ms = summarize_ms(e2els, percentiles);
  m.client_lag_events = static_cast<int64_t>(read_lags.size());
  if (!read_lags.empty()) m.client_lag_ms = summarize_ms(read_lags, percentiles);
  m.client_send_lag_ms = summarize_ms(send_lags, percentiles);
  m.client_queue_time_ms = summarize_ms(queue_times, percentiles);
  m.e2el_including_client_queue_ms = summarize_ms(e2el_queue, percentiles);
  m.per_token_itl_ms = summarize_ms(per_token_itls, percentiles);
  return m;
}

}  // namespace servetune::loadgen
