// Multi-turn metrics (see session_metrics.h).
#include "loadgen/session_metrics.h"

#include <algorithm>
#include <map>

namespace servetune::loadgen {
namespace {

std::optional<double> cached_fraction(int64_t cached, int64_t prompt) {
  if (prompt <= 0) return std::nullopt;
  return static_cast<double>(cached) / static_cast<double>(prompt);
}

}  // namespace

SessionMetrics compute_session_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                       const std::vector<double>& percentiles,
                                       const std::function<int64_t(const std::string&)>& count_tokens) {
  SessionMetrics s;
  std::vector<RequestOutput> first, later;
  struct Session {
    int64_t turns = 0;
    bool ok = true;
    double start = 0.0, end = 0.0;
  };
  std::map<int64_t, Session> sessions;
  std::vector<std::vector<double>> ttft_by_turn;
  int64_t cached[2] = {0, 0}, cached_prompt[2] = {0, 0};
  for (const RequestOutput& o : outputs) {
    (o.turn == 0 ? first : later).push_back(o);
    Session& ses = sessions[o.session];
    if (ses.turns++ == 0) ses.start = o.start_time;
    ses.ok = ses.ok && o.success;
    if (!o.success) continue;
    ses.start = std::min(ses.start, o.start_time);
    ses.end = std::max(ses.end, o.start_time + o.latency);
    if (ttft_by_turn.size() <= static_cast<size_t>(o.turn)) ttft_by_turn.resize(static_cast<size_t>(o.turn) + 1);
    ttft_by_turn[static_cast<size_t>(o.turn)].push_back(o.ttft);
    if (o.cached_tokens >= 0) {
      cached[o.turn == 0 ? 0 : 1] += o.cached_tokens;
      cached_prompt[o.turn == 0 ? 0 : 1] += o.prompt_len;
    }
  }
  s.first_turn = compute_metrics(first, duration_s, percentiles, {}, count_tokens);
  s.later_turns = compute_metrics(later, duration_s, percentiles, {}, count_tokens);
  std::vector<double> times;
  int64_t turns = 0;
  for (const auto& [id, ses] : sessions) {
    turns += ses.turns;
    if (!ses.ok) continue;
    ++s.completed_sessions;
    times.push_back(ses.end - ses.start);
  }
  s.sessions = static_cast<int64_t>(sessions.size());
  s.mean_turns = s.sessions > 0 ? static_cast<double>(turns) / static_cast<double>(s.sessions) : 0.0;
  s.session_time_ms = summarize_ms(times, percentiles);
  for (const auto& v : ttft_by_turn) s.mean_ttft_ms_by_turn.push_back(summarize_ms(v, {}).mean);
  s.reported_cached_fraction_first = cached_fraction(cached[0], cached_prompt[0]);
  s.reported_cached_fraction_later = cached_fraction(cached[1], cached_prompt[1]);
  return s;
}

}  // namespace servetune::loadgen
