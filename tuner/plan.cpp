// Plan validation and the --dry-run listing (see plan.h, sweep_runner.h).
#include "tuner/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "servetune/error.h"
#include "servetune/model_info.h"
#include "tuner/comm_cost.h"
#include "tuner/command_line.h"
#include "tuner/results_table.h"
#include "tuner/server_command.h"
#include "tuner/strategy.h"
#include "tuner/sweep_runner.h"

namespace servetune::tuner {

std::vector<Candidate> first_candidates(const SweepSpec& spec, const SearchSpace& space) {
  std::unique_ptr<Strategy> strategy = Strategy::make(spec, space);
  const auto batch = strategy->next(ResultsTable{});
  std::vector<Candidate> out;
  if (batch) {
    for (const auto& t : batch->trials) out.push_back(t.candidate);
  }
  return out;
}

void validate_plan(const SweepSpec& spec, const SearchSpace& space) {
  const std::vector<Candidate> cs = first_candidates(spec, space);
  std::map<std::string, size_t> reasons;
  for (const auto& c : cs) {
    if (c.skip_reason.empty()) return;
    ++reasons[c.skip_reason];
  }
  std::string why;
  for (const auto& [r, n] : reasons) why += "\n  " + std::to_string(n) + " x " + r;
  throw_usage(spec.source + ": constraints: every candidate of the " + (spec.strategy.kind == "staged" ? "first stage" : "space") +
              " is excluded:" + why);
}

namespace {

// What one candidate's engine holds per process: its share of the weights and of a token's KV cache on each of its
// tp_size ranks (a latent cache row is whole on every rank), and how many replicas hold that.
std::string memory_estimate(const ModelInfo& m, const EngineConfig& c) {
  const double tp = std::max(1, c.tp_size);
  const auto kv_element = static_cast<double>(kv_element_bytes(c.kv_cache_dtype, c.device));
  if (c.enable_dp_attention) {
    // The replicas are the ranks: each holds its attention, dense layers and head whole and 1 / tp_size of the
    // routed experts (ModelInfo does not split the bytes, so this is the upper bound), and caches only its own
    // requests' tokens, whole.
    return "memory per rank: weights under " + format_bytes(static_cast<double>(m.weight_bytes)) + " (routed experts split " +
           std::to_string(c.tp_size) + " ways), KV " + format_bytes(static_cast<double>(m.kv_values_per_token) * kv_element) +
           " per token of its own requests";
  }
  const double kv = static_cast<double>(m.kv_values_per_token) * kv_element / (m.kv_shared_by_ranks ? 1.0 : tp);
  std::string text = "memory per rank: weights " + format_bytes(static_cast<double>(m.weight_bytes) / tp) + ", KV " +
                     format_bytes(kv) + " per token";
  if (c.dp_size > 1) text += ", x " + std::to_string(c.dp_size) + " replicas";
  return text;
}

// The cost model's lines (comm_cost.h) for a decode step of max_running_requests sequences and a prefill chunk of
// chunked_prefill_size tokens (one prompt ending in it); none on one rank.
std::vector<std::string> comm_estimate(const ModelInfo& m, const EngineConfig& c, const std::vector<std::string>& names) {
  std::vector<const Interconnect*> links;
  for (const auto& name : names) links.push_back(find_interconnect(name));
  std::vector<std::string> lines;
  const int64_t decode = c.max_running_requests, prefill = c.chunked_prefill_size;
  for (const auto& [step, shape] : {std::pair<std::string, StepShape>{"decode step", {decode, decode}},
                                    std::pair<std::string, StepShape>{"prefill chunk", {prefill, 1}}}) {
    if (shape.tokens <= 0) continue;
    std::string line = comm_cost_line(step, m, c.tp_size, c.ep_size, shape, links);
    if (!line.empty()) lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace

void print_plan(std::FILE* out, const SweepSpec& spec) {
  SearchSpace space(spec);
  validate_plan(spec, space);
  std::fprintf(out, "Sweep %s (%s)\n", spec.name.c_str(), spec.source.c_str());
  if (!spec.description.empty()) std::fprintf(out, "  %s\n", spec.description.c_str());
  std::fprintf(out, "Target: %s, model %s\n", spec.target.engine.c_str(), spec.target.model.c_str());
  const std::optional<ModelInfo>& shape = space.model_shape();
  if (spec.builtin() && shape) {
    std::fprintf(out, "  %s, %lld layers%s, weights %s, KV cache %lld values per token\n", shape->architecture.c_str(),
                 static_cast<long long>(shape->n_layers),
                 shape->experts > 0 ? (", " + std::to_string(shape->experts) + " experts (top " +
                                       std::to_string(shape->experts_per_token) + ")").c_str()
                                    : "",
                 format_bytes(static_cast<double>(shape->weight_bytes)).c_str(),
                 static_cast<long long>(shape->kv_values_per_token));
  }
  if (!spec.target.settings.empty()) std::fprintf(out, "  fixed settings: %s\n", spec.target.settings.dump().c_str());
  for (const auto& [name, s] : spec.target.servers) {
    std::fprintf(out, "  server %s%s: %s (health %s, backend %s, startup timeout %.0fs)\n", name.c_str(),
                 s.version.empty() ? "" : (" " + s.version).c_str(), s.command.c_str(), s.health.c_str(), s.backend.c_str(),
                 s.startup_timeout_s);
  }
  std::fprintf(out, "Space: %zu candidates\n", space.size());
  for (const auto& d : spec.space) {
    std::string vals;
    for (const auto& v : d.values) vals += (vals.empty() ? "" : ", ") + v.dump();
    std::fprintf(out, "  %s: [%s]%s\n", d.name.c_str(), vals.c_str(), d.values.size() == 1 ? " (fixed)" : "");
  }
  for (const auto& c : spec.constraints) std::fprintf(out, "  constraint: %s\n", c.c_str());
  std::fprintf(out, "  baseline: %s (%s)\n", space.baseline().id.c_str(), space.baseline().label.c_str());
  std::fprintf(out, "Strategy: %s\n", spec.strategy.kind.c_str());
  for (const auto& st : spec.strategy.stages) {
    std::string dims;
    for (const auto& d : st.dims) dims += (dims.empty() ? "" : ", ") + d;
    std::fprintf(out, "  stage %s: %s\n", st.name.c_str(), dims.c_str());
  }
  if (spec.strategy.kind == "halving") {
    std::string rungs;
    for (auto n : spec.strategy.screen_prompts) rungs += (rungs.empty() ? "" : ", ") + std::to_string(n);
    std::fprintf(out, "  screening rungs of %s prompts on %s, keep %.0f%% per rung\n", rungs.c_str(),
                 spec.objective_workloads().front()->name.c_str(), spec.strategy.keep * 100.0);
  }
  std::fprintf(out, "Workloads (%zu; each run %d time%s per candidate):\n", spec.workloads.size(), spec.repeat, spec.repeat == 1 ? "" : "s");
  for (const auto& w : spec.workloads) std::fprintf(out, "  %-24s servetune bench %s\n", w.name.c_str(), bench_flags(w.to_json()).c_str());
  std::fprintf(out, "Objective: %s %s on %s", spec.objective.maximize ? "max" : "min", spec.objective.metric.c_str(),
               spec.objective.workload.c_str());
  for (const auto& [k, v] : spec.slo) std::fprintf(out, ", %s <= %g", k.c_str(), v);
  std::fprintf(out, "\n");
  const std::vector<Candidate> cs = first_candidates(spec, space);
  std::fprintf(out, "%s (%zu):\n", spec.strategy.kind == "staged" ? "First stage" : "Candidates", cs.size());
  for (const auto& c : cs) {
    if (!c.skip_reason.empty()) {
      std::fprintf(out, "  %s %s: skipped: %s\n", c.id.c_str(), c.label.c_str(), c.skip_reason.c_str());
    } else if (spec.builtin()) {
      std::fprintf(out, "  %s %s: servetune serve --model %s %s\n", c.id.c_str(), c.label.c_str(),
                   shell_quote(spec.target.model).c_str(), engine_flags(space.full_settings(c)).c_str());
      if (space.model_shape()) {
        const EngineConfig config = space.engine_config(c);
        std::fprintf(out, "    (%s)\n", memory_estimate(*space.model_shape(), config).c_str());
        for (const auto& line : comm_estimate(*space.model_shape(), config, spec.interconnects)) std::fprintf(out, "    (%s)\n", line.c_str());
      }
    } else {
      std::string why;
      const int port = spec.target.port == 0 ? 8000 : spec.target.port;
      const auto cmd = render_launch(spec, space.full_settings(c), port, why);
      std::fprintf(out, "  %s %s: %s\n", c.id.c_str(), c.label.c_str(), cmd ? cmd->command.c_str() : why.c_str());
    }
  }
  std::fflush(out);
}

}  // namespace servetune::tuner
