// Per-step collective volumes and their alpha-beta time on named interconnects (see comm_cost.h).
#include "tuner/comm_cost.h"

#include <cmath>
#include <cstdio>

#include "servetune/error.h"

namespace servetune::tuner {

// Bandwidth per GPU per direction and one message's latency. Sources, and what is assumed:
// - nvlink4 (H100 / H200 SXM, 8 GPUs on NVSwitch): 900 GB/s bidirectional per GPU, so 450 GB/s per direction
//   (NVIDIA's H100 SXM figure, as quoted in https://github.com/NVIDIA/nccl/issues/1264, where the p2p test measures
//   380 of the 450); latency 1 us per ring hop (assumption: NCCL's small-message all-reduce on 8 GPUs takes ~10-15 us
//   over 14 hops).
// - mi300x-if (MI300X, 8 GPUs fully meshed by Infinity Fabric): 7 links of 64 GB/s per direction (128 GB/s
//   bidirectional each, AMD's MI300X figure; no source in the reference corpus) = 448 GB/s per direction, assuming
//   the collectives spread over all 7 links (RCCL's multiple rings on the mesh); a single ring would see 64 GB/s.
//   Latency 2 us per hop (assumption).
// - 100gbe / 400gbe (between nodes, RDMA): line rate 12.5 / 50 GB/s per direction (100 / 400 Gbit/s, one NIC per
//   GPU assumed); latency 15 / 10 us per message (assumption, within the usual 10-20 us of RoCE).
const std::vector<Interconnect>& interconnects() {
  static const std::vector<Interconnect> links = {
      {"nvlink4", 450.0, 1.0},
      {"mi300x-if", 448.0, 2.0},
      {"100gbe", 12.5, 15.0},
      {"400gbe", 50.0, 10.0},
  };
  return links;
}

const Interconnect* find_interconnect(const std::string& name) {
  for (const Interconnect& l : interconnects()) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

const char* comm_scheme_label(CommScheme scheme) {
  switch (scheme) {
    case CommScheme::kTensorParallel: return "TP all-reduce";
    case CommScheme::kExpertAllToAll: return "EP all-to-all (not implemented)";
    case CommScheme::kDpAttention: return "DP attention";
    case CommScheme::kDpAttentionAllToAll: return "DP attention + all-to-all";
  }
  return "";
}

namespace {

// A ring all-reduce sends 2(n-1)/n of the buffer in 2(n-1) steps (reduce-scatter, then all-gather).
StepCollective ring_all_reduce(const std::string& what, int64_t calls, int64_t payload, int n) {
  return {CollectiveKind::kAllReduce, what, calls, payload, 2.0 * (n - 1) / n * static_cast<double>(payload), 2 * (n - 1)};
}

// Ring all-gather and reduce-scatter send (n-1)/n of the whole buffer in n-1 steps; a pairwise all-to-all sends the
// (n-1)/n of its elements bound for other ranks (uniform routing) in n-1 messages.
StepCollective ring_one_way(CollectiveKind kind, const std::string& what, int64_t calls, int64_t payload, int n) {
  return {kind, what, calls, payload, static_cast<double>(n - 1) / n * static_cast<double>(payload), n - 1};
}

// The vocab-parallel head's rows gathered whole (model/shard_collectives.cpp): logits_rows x vocab, when any.
void add_logits_gather(std::vector<StepCollective>& out, const ModelInfo& m, int n, const StepShape& s) {
  if (s.logits_rows > 0) {
    out.push_back(ring_one_way(CollectiveKind::kAllGather, "logits gather", 1, s.logits_rows * m.vocab * kCommElementBytes, n));
  }
}

// 1 - C(experts - experts/n, k) / C(experts, k): a token's k distinct experts, drawn uniformly, include one of a
// given rank's experts/n.
double rank_owns_token_probability(int64_t experts, int64_t k, int n) {
  const int64_t others = experts - experts / n;
  double none = 1.0;
  for (int64_t i = 0; i < k; ++i) none *= others - i > 0 ? static_cast<double>(others - i) / static_cast<double>(experts - i) : 0.0;
  return 1.0 - none;
}

}  // namespace

std::vector<StepCollective> step_collectives(CommScheme scheme, const ModelInfo& m, int n, int ep, const StepShape& s) {
  if (n < 1 || ep < 1 || n % ep != 0) {
    throw_usage("communication cost: " + std::to_string(n) + " ranks with ep " + std::to_string(ep) + " is no layout");
  }
  std::vector<StepCollective> out;
  if (n == 1 || s.tokens == 0) return out;  // one rank, or a step with no tokens, runs no collective
  const int64_t hidden_rows = s.tokens * m.hidden * kCommElementBytes;  // every token's hidden state
  switch (scheme) {
    case CommScheme::kTensorParallel:
      // Each layer sums the row-parallel attention output and the FFN's partial outputs (llama.cpp / moe_decoder.cpp);
      // expert parallelism adds its experts' partial sums to the same FFN all-reduce.
      out.push_back(ring_all_reduce("attention + FFN sums", 2 * m.n_layers, hidden_rows, n));
      break;
    case CommScheme::kExpertAllToAll: {
      // Attention and the dense layers' MLPs stay tensor parallel; each MoE layer's FFN sum becomes a dispatch of every
      // token's hidden state to the ranks owning its top-k experts and a combine back (DeepEP), each rank sending its
      // 1/n of the tokens. A token goes once to each such rank, not once per expert (DeepEP's is_token_in_rank): with
      // uniform routing over n equal expert ranges a rank owns one of its k experts with probability
      // 1 - C(E - E/n, k) / C(E, k). Shared experts' sums are assumed to join the combine.
      const int64_t moe_layers = m.n_layers - m.dense_layers;
      out.push_back(ring_all_reduce("attention + dense FFN sums", m.n_layers + m.dense_layers, hidden_rows, n));
      const double owns = rank_owns_token_probability(m.experts, m.experts_per_token, n);
      const double token_bytes = static_cast<double>((s.tokens + n - 1) / n * m.hidden * kCommElementBytes);
      StepCollective a2a = ring_one_way(CollectiveKind::kAllToAll, "MoE dispatch + combine", 2 * moe_layers,
                                        std::llround(token_bytes * n * owns), n);
      a2a.sent_bytes = token_bytes * (n - 1) * owns;  // the copies bound for the other ranks
      out.push_back(a2a);
      break;
    }
    case CommScheme::kDpAttention: {
      // As model/moe_decoder.cpp runs it: each replica's attention, dense MLPs and head on its own requests (no
      // collective); every MoE layer gathers all replicas' tokens before and reduce-scatters the sums back after;
      // one gather of the replicas' token counts (8 bytes each) per step.
      const int64_t moe_layers = m.n_layers - m.dense_layers;
      out.push_back(ring_one_way(CollectiveKind::kAllGather, "replica token counts", 1, 8 * n, n));
      out.push_back(ring_one_way(CollectiveKind::kAllGather, "hidden gather before MoE", moe_layers, hidden_rows, n));
      out.push_back(ring_one_way(CollectiveKind::kReduceScatter, "MoE output scatter", moe_layers, hidden_rows, n));
      return out;
    }
    case CommScheme::kDpAttentionAllToAll: {
      // As model/moe_decoder.cpp runs it: per MoE layer one gather of every rank's layout (experts + ranks counts, 8
      // bytes each), then each replica's tokens (tokens / n) go once to every rank of each expert-parallel group
      // owning one of their experts (uniform routing: probability 1 - C(E - E/ep, k) / C(E, k) per group), as rows
      // of hidden + 2k values (the ids and weights), and the sums come back as rows of hidden values.
      const int64_t moe_layers = m.n_layers - m.dense_layers;
      out.push_back(ring_one_way(CollectiveKind::kAllGather, "MoE layouts", moe_layers, n * (m.experts + n) * 8, n));
      const double owns = rank_owns_token_probability(m.experts, m.experts_per_token, ep);
      const double rows = static_cast<double>(s.tokens) * owns;  // one rank's tokens / n, to each of n ranks: itself too
      for (const auto& [what, width] : {std::pair<const char*, int64_t>{"MoE dispatch", m.hidden + 2 * m.experts_per_token},
                                        std::pair<const char*, int64_t>{"MoE combine", m.hidden}}) {
        StepCollective a2a = ring_one_way(CollectiveKind::kAllToAll, what, moe_layers,
                                          std::llround(rows * static_cast<double>(width * kCommElementBytes)), n);
        a2a.sent_bytes = rows * (n - 1) / n * static_cast<double>(width * kCommElementBytes);  // to the other ranks
        out.push_back(a2a);
      }
      return out;
    }
  }
  add_logits_gather(out, m, n, s);
  return out;
}

CollectiveStats predicted_stats(const std::vector<StepCollective>& cs) {
  CollectiveStats stats{};
  for (const StepCollective& c : cs) {
    CollectiveTotals& t = totals_of(stats, c.kind);
    t.calls += c.calls;
    t.bytes += c.calls * c.payload_bytes;
  }
  return stats;
}

double sent_bytes_per_step(const std::vector<StepCollective>& cs) {
  double bytes = 0.0;
  for (const StepCollective& c : cs) bytes += static_cast<double>(c.calls) * c.sent_bytes;
  return bytes;
}

double predicted_seconds(const std::vector<StepCollective>& cs, const Interconnect& link) {
  double seconds = 0.0;
  for (const StepCollective& c : cs) {
    seconds += static_cast<double>(c.calls) *
               (static_cast<double>(c.hops) * link.latency_us * 1e-6 + c.sent_bytes / (link.gb_per_s * 1e9));
  }
  return seconds;
}

namespace {

std::string format_comm_time(double seconds) {
  char buf[32];
  if (seconds < 1e-3) std::snprintf(buf, sizeof buf, "%.0f us", seconds * 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1e3);
  return buf;
}

}  // namespace

std::string comm_cost_line(const std::string& step_name, const ModelInfo& m, int n, int ep, const StepShape& s,
                           const std::vector<const Interconnect*>& links) {
  if (n <= 1 || s.tokens == 0) return "";
  std::vector<CommScheme> schemes = {CommScheme::kTensorParallel};
  if (m.experts > 0 && ep == n) schemes.push_back(CommScheme::kExpertAllToAll);  // DeepEP's layout: one expert range per rank
  if (m.experts > 0) schemes.insert(schemes.end(), {CommScheme::kDpAttention, CommScheme::kDpAttentionAllToAll});
  std::string line = "comm per " + step_name + " (" + std::to_string(s.tokens) + " tokens):";
  for (size_t i = 0; i < schemes.size(); ++i) {
    const auto cs = step_collectives(schemes[i], m, n, ep, s);
    line += std::string(i == 0 ? " " : "; ") + comm_scheme_label(schemes[i]) + " sends " + format_bytes(sent_bytes_per_step(cs)) +
            "/rank ->";
    for (size_t k = 0; k < links.size(); ++k) {
      line += std::string(k == 0 ? " " : ", ") + format_comm_time(predicted_seconds(cs, *links[k])) + " " + links[k]->name;
    }
  }
  return line;
}

}  // namespace servetune::tuner
