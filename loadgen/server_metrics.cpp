// Speculative-decoding and prefix-cache counters from a server's /metrics (see server_metrics.h).
#include "loadgen/server_metrics.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace servetune::loadgen {
namespace {

// The value of label `key` in a `{k="v",...}` label set (escapes \" \\ \n undone); nullopt when absent.
std::optional<std::string> label_value(std::string_view labels, std::string_view key) {
  size_t p = 0;
  while (p < labels.size()) {
    const size_t eq = labels.find('=', p);
    if (eq == std::string_view::npos || eq + 1 >= labels.size() || labels[eq + 1] != '"') return std::nullopt;
    std::string_view name = labels.substr(p, eq - p);
    while (!name.empty() && (name.front() == ',' || name.front() == ' ')) name.remove_prefix(1);
    std::string value;
    size_t q = eq + 2;
    for (; q < labels.size() && labels[q] != '"'; ++q) {
      if (labels[q] == '\\' && q + 1 < labels.size()) {
        ++q;
        value.push_back(labels[q] == 'n' ? '\n' : labels[q]);
      } else {
        value.push_back(labels[q]);
      }
    }
    if (q >= labels.size()) return std::nullopt;
    if (name == key) return value;
    p = q + 1;
  }
  return std::nullopt;
}

// Calls f(name, labels, value) for each sample line of a Prometheus text exposition; malformed lines are skipped.
template <class F>
void for_each_sample(std::string_view text, F&& f) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line.front() == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    std::string_view labels, rest = line.substr(name_end);
    if (rest.front() == '{') {
      const size_t close = rest.rfind('}');
      if (close == std::string_view::npos) continue;
      labels = rest.substr(1, close - 1);
      rest = rest.substr(close + 1);
    }
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    const std::string number(rest.substr(0, rest.find(' ')));
    char* parsed_end = nullptr;
    const double v = std::strtod(number.c_str(), &parsed_end);
    if (number.empty() || parsed_end != number.c_str() + number.size() || !std::isfinite(v)) continue;
    f(name, labels, v);
  }
}

}  // namespace

std::optional<SpecDecodeStats> parse_spec_decode_counters(std::string_view text) {
  SpecDecodeStats s;
  bool found = false;
  for_each_sample(text, [&](std::string_view name, std::string_view labels, double v) {
    const auto count = static_cast<int64_t>(std::llround(v));
    if (name == "vllm:spec_decode_num_drafts_total") {
      s.num_drafts += count;
      found = true;
    } else if (name == "vllm:spec_decode_num_draft_tokens_total") {
      s.draft_tokens += count;
    } else if (name == "vllm:spec_decode_num_accepted_tokens_total") {
      s.accepted_tokens += count;
    } else if (name == "servetune:spec_decode_draft_seconds_total") {
      s.draft_seconds += v;
    } else if (name == "servetune:spec_decode_disabled_steps_total") {
      s.disabled_steps += count;
    } else if (name == "vllm:spec_decode_num_accepted_tokens_per_pos_total") {
      const auto position = label_value(labels, "position");
      size_t i = 0;
      if (!position || std::from_chars(position->data(), position->data() + position->size(), i).ec != std::errc() ||
          i > 4096) {
        return;
      }
      if (s.accepted_per_position.size() <= i) s.accepted_per_position.resize(i + 1, 0);
      s.accepted_per_position[i] += count;
    }
  });
  if (!found) return std::nullopt;
  return s;
}

std::optional<PrefixCacheCounters> parse_prefix_cache_counters(std::string_view text) {
  PrefixCacheCounters c;
  bool found = false;
  for_each_sample(text, [&](std::string_view name, std::string_view, double v) {
    if (name == "vllm:prefix_cache_queries_total") {
      c.queries += static_cast<int64_t>(std::llround(v));
      c.has_counters = found = true;
    } else if (name == "vllm:prefix_cache_hits_total") {
      c.hits += static_cast<int64_t>(std::llround(v));
    } else if (name == "sglang:cache_hit_rate") {
      c.sglang_hit_rate = v;
      found = true;
    }
  });
  if (!found) return std::nullopt;
  return c;
}

std::optional<PrefixCacheHitRate> prefix_cache_hit_rate(const PrefixCacheCounters& before,
                                                        const PrefixCacheCounters& after) {
  if (after.has_counters && before.has_counters) {
    const int64_t q = after.queries - before.queries;
    if (q <= 0) return std::nullopt;
    return PrefixCacheHitRate{static_cast<double>(after.hits - before.hits) / static_cast<double>(q),
                              "server /metrics: vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total"};
  }
  if (after.sglang_hit_rate) return PrefixCacheHitRate{*after.sglang_hit_rate, "server /metrics: sglang:cache_hit_rate"};
  return std::nullopt;
}

SpecDecodeStats spec_decode_difference(const SpecDecodeStats& after, const SpecDecodeStats& before) {
  SpecDecodeStats d;
  d.num_drafts = after.num_drafts - before.num_drafts;
  d.draft_tokens = after.draft_tokens - before.draft_tokens;
  d.accepted_tokens = after.accepted_tokens - before.accepted_tokens;
  d.draft_seconds = after.draft_seconds - before.draft_seconds;
  d.disabled_steps = after.disabled_steps - before.disabled_steps;
  for (size_t i = 0; i < after.accepted_per_position.size(); ++i) {
    const int64_t b = i < before.accepted_per_position.size() ? before.accepted_per_position[i] : 0;
    d.accepted_per_position.push_back(after.accepted_per_position[i] - b);
  }
  return d;
}

std::optional<std::string> scrape_metrics(const std::string& metrics_url, const std::string& api_key) {
  return http_get(metrics_url, 5000, api_key);
}

}  // namespace servetune::loadgen
