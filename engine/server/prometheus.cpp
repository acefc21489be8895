// Prometheus histograms and the /metrics text (see prometheus.h).
#include "server/prometheus.h"

#include <algorithm>

#include "server/json_text.h"

namespace servetune::server {
namespace {

// vLLM's buckets, so histogram_quantile over its dashboards reads the same.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTokenBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                           0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

std::string number(double v) {
  std::string out;
  append_json_number(out, v);
  return out;
}

std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + ' ' + help + "\n# TYPE " + name + ' ' + type + '\n';
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + '{' + labels + "} " + number(v) + '\n';
}

void sample(std::string& out, const std::string& name, const std::string& labels, int64_t v) {
  out += name + '{' + labels + "} " + std::to_string(v) + '\n';
}

// `labels` plus the kind of collective `k`.
std::string kind_label(const std::string& labels, size_t k) {
  return labels + ",kind=\"" + collective_kind_name(static_cast<CollectiveKind>(k)) + '"';
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);  // first bound >= v: le is inclusive
  buckets_[static_cast<size_t>(it - bounds_.begin())].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + '\n';
  }
  out += name + "_sum{" + labels + "} " + number(sum_.load(std::memory_order_relaxed)) + '\n';
  out += name + "_count{" + labels + "} " + std::to_string(cumulative) + '\n';
}

ServerMetrics::ServerMetrics() : ttft(kTtftBuckets), itl(kTokenBuckets), tpot(kTokenBuckets), e2e(kE2eBuckets) {}

void ServerMetrics::count_response(int status) {
  if (status >= 0 && status < static_cast<int>(responses.size())) {
    responses[static_cast<size_t>(status)].fetch_add(1, std::memory_order_relaxed);
  }
}

void ServerMetrics::count_finish(FinishReason r) {
  size_t i = 2;
  if (r == FinishReason::kStop) i = 0;
  if (r == FinishReason::kLength) i = 1;
  finished[i].fetch_add(1, std::memory_order_relaxed);
}

std::string render_metrics(const ServerMetrics& m, const EngineStats& s, const std::string& model_name, bool speculative) {
  const std::string labels = "model_name=\"" + label_value(model_name) + '"';
  std::string out;
  out.reserve(16384);
  header(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
  sample(out, "vllm:num_requests_running", labels, s.running);
  header(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  sample(out, "vllm:num_requests_waiting", labels, s.waiting);
  header(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  sample(out, "vllm:kv_cache_usage_perc", labels, s.kv_usage());
  header(out, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.");
  sample(out, "vllm:prefix_cache_queries_total", labels, s.prefix_query_tokens);
  header(out, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.");
  sample(out, "vllm:prefix_cache_hits_total", labels, s.prefix_hit_tokens);
  header(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed (prefix-cache hits excluded).");
  sample(out, "vllm:prompt_tokens_total", labels, s.prompt_tokens);
  header(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.");
  sample(out, "vllm:generation_tokens_total", labels, s.generation_tokens);
  header(out, "vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.");
  sample(out, "vllm:num_preemptions_total", labels, s.preemptions);
  header(out, "vllm:request_success_total", "counter", "Count of finished requests by finish reason.");
  const char* reasons[] = {"stop", "length", "abort"};
  for (size_t i = 0; i < 3; ++i) {
    sample(out, "vllm:request_success_total", labels + ",finished_reason=\"" + reasons[i] + '"',
           m.finished[i].load(std::memory_order_relaxed));
  }
  header(out, "vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.");
  m.ttft.render(out, "vllm:time_to_first_token_seconds", labels);
  header(out, "vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.");
  m.itl.render(out, "vllm:inter_token_latency_seconds", labels);
  header(out, "vllm:time_per_output_token_seconds", "histogram",
         "Histogram of time per output token in seconds (same observations as vllm:inter_token_latency_seconds).");
  m.itl.render(out, "vllm:time_per_output_token_seconds", labels);
  header(out, "vllm:request_time_per_output_token_seconds", "histogram", "Histogram of time_per_output_token_seconds per request.");
  m.tpot.render(out, "vllm:request_time_per_output_token_seconds", labels);
  header(out, "vllm:e2e_request_latency_seconds", "histogram", "Histogram of end to end request latency in seconds.");
  m.e2e.render(out, "vllm:e2e_request_latency_seconds", labels);

  if (speculative) {
    header(out, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts (verifications with draft tokens).");
    sample(out, "vllm:spec_decode_num_drafts_total", labels, s.spec_num_drafts);
    header(out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.");
    sample(out, "vllm:spec_decode_num_draft_tokens_total", labels, s.spec_draft_tokens);
    header(out, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.");
    sample(out, "vllm:spec_decode_num_accepted_tokens_total", labels, s.spec_accepted_tokens);
    header(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
    for (size_t i = 0; i < s.spec_accepted_per_position.size(); ++i) {
      sample(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", labels + ",position=\"" + std::to_string(i) + '"',
             s.spec_accepted_per_position[i]);
    }
    header(out, "servetune:spec_decode_draft_seconds_total", "counter", "Time spent proposing drafts (the draft head's forwards).");
    sample(out, "servetune:spec_decode_draft_seconds_total", labels, s.spec_draft_seconds);
    header(out, "servetune:spec_decode_disabled_steps_total", "counter",
           "Steps that drafted nothing because of speculative_disable_by_batch_size.");
    sample(out, "servetune:spec_decode_disabled_steps_total", labels, s.spec_disabled_steps);
  }

  header(out, "servetune:kv_blocks_used", "gauge", "KV cache blocks held by requests.");
  sample(out, "servetune:kv_blocks_used", labels, s.kv_blocks_used);
  header(out, "servetune:kv_blocks_total", "gauge", "KV cache blocks.");
  sample(out, "servetune:kv_blocks_total", labels, s.kv_blocks_total);
  header(out, "servetune:forward_seconds_total", "counter", "Wall time of the model's forward passes.");
  sample(out, "servetune:forward_seconds_total", labels, s.forward_seconds);
  header(out, "servetune:comm_seconds_total", "counter",
         "Tensor-parallel collectives: the communication path's own time (per collective, the fastest rank's).");
  sample(out, "servetune:comm_seconds_total", labels, s.comm_seconds);
  header(out, "servetune:comm_wait_seconds_total", "counter", "Tensor-parallel collectives: rank 0's waits for slower ranks.");
  sample(out, "servetune:comm_wait_seconds_total", labels, s.comm_wait_seconds);
  // The same per kind of collective (all_reduce for tensor parallelism, all_gather / reduce_scatter for DP attention).
  const auto per_kind = [&](const std::string& name, const char* help, auto field) {
    header(out, name, "counter", help);
    for (size_t k = 0; k < kCollectiveKinds; ++k) sample(out, name, kind_label(labels, k), s.collectives[k].*field);
  };
  per_kind("servetune:comm_collective_calls_total", "The model's collectives run, by kind.", &CollectiveTotals::calls);
  per_kind("servetune:comm_collective_bytes_total", "Payload bytes of the model's collectives (rank 0's), by kind.",
           &CollectiveTotals::bytes);
  per_kind("servetune:comm_collective_seconds_total", "Time of the model's collectives (as comm_seconds), by kind.",
           &CollectiveTotals::seconds);
  header(out, "servetune:idle_batches_total", "counter",
         "DP attention: steps a replica ran with no tokens of its own, to join the MoE layers' collectives.");
  sample(out, "servetune:idle_batches_total", labels, s.idle_batches);
  header(out, "servetune:kv_cache_bytes_per_token", "gauge",
         "KV cache bytes one token takes over all layers (per-head K and V, or a latent-attention model's latent row).");
  sample(out, "servetune:kv_cache_bytes_per_token", labels, s.kv_bytes_per_token);
  if (s.moe_experts > 0) {
    header(out, "servetune:moe_routed_tokens_total", "counter", "Token-expert assignments over all MoE layers and steps.");
    sample(out, "servetune:moe_routed_tokens_total", labels, s.moe_routed_tokens);
    header(out, "servetune:moe_busiest_expert_tokens_total", "counter",
           "Per MoE layer and step, the tokens of the busiest expert, summed.");
    sample(out, "servetune:moe_busiest_expert_tokens_total", labels, s.moe_busiest_expert_tokens);
    header(out, "servetune:moe_expert_imbalance", "gauge",
           "Busiest expert's tokens over the mean per expert, since start (1: even load).");
    sample(out, "servetune:moe_expert_imbalance", labels, s.moe_expert_imbalance());
    header(out, "servetune:moe_busiest_ep_group_tokens_total", "counter",
           "Per MoE layer and step, the token-expert assignments of the expert-parallel group with the most, summed.");
    sample(out, "servetune:moe_busiest_ep_group_tokens_total", labels, s.moe_busiest_ep_group_tokens);
    header(out, "servetune:moe_ep_imbalance", "gauge",
           "Busiest expert-parallel group's assignments over the mean per group, since start (1: even; ep_size: one group).");
    sample(out, "servetune:moe_ep_imbalance", labels, s.moe_ep_imbalance());
  }
  header(out, "servetune:requests_in_flight", "gauge",
         "Engine requests (one per choice of a generation request) the HTTP server submitted and not finished.");
  sample(out, "servetune:requests_in_flight", labels, m.in_flight.load(std::memory_order_relaxed));
  header(out, "servetune:requests_preparing", "gauge",
         "Requests whose body is being parsed, templated or tokenized (on the worker threads, off the I/O threads).");
  sample(out, "servetune:requests_preparing", labels, m.preparing.load(std::memory_order_relaxed));
  header(out, "servetune:engine_requests_aborted_total", "counter", "Requests the engine aborted (client gone, shutdown).");
  sample(out, "servetune:engine_requests_aborted_total", labels, s.requests_aborted);
  header(out, "servetune:http_connections", "gauge", "Open HTTP connections.");
  sample(out, "servetune:http_connections", labels, m.connections_open.load(std::memory_order_relaxed));
  header(out, "servetune:http_connections_total", "counter", "Accepted HTTP connections.");
  sample(out, "servetune:http_connections_total", labels, m.connections_total.load(std::memory_order_relaxed));
  header(out, "servetune:http_connections_refused_total", "counter", "Connections closed at accept (over --max-connections).");
  sample(out, "servetune:http_connections_refused_total", labels, m.connections_refused.load(std::memory_order_relaxed));
  header(out, "servetune:http_responses_total", "counter", "HTTP responses by status code.");
  for (size_t code = 100; code < m.responses.size(); ++code) {
    const int64_t n = m.responses[code].load(std::memory_order_relaxed);
    if (n > 0) sample(out, "servetune:http_responses_total", labels + ",status=\"" + std::to_string(code) + '"', n);
  }
  return out;
}

}  // namespace servetune::server
