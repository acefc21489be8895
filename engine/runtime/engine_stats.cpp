// EngineStats arithmetic on whole snapshots: sums over replicas and differences over a run. Only counters and gauges
// are combined here; the ratios stay derived (engine.h), so they come out of a sum or a difference unchanged in kind.
#include <algorithm>

#include "servetune/engine.h"

namespace servetune {

void EngineStats::add_replica(const EngineStats& r) {
  running += r.running;
  waiting += r.waiting;
  kv_blocks_total += r.kv_blocks_total;
  kv_blocks_used += r.kv_blocks_used;
  kv_blocks_free += r.kv_blocks_free;
  page_size = r.page_size;
  prefix_query_tokens += r.prefix_query_tokens;
  prefix_hit_tokens += r.prefix_hit_tokens;
  steps += r.steps;
  batched_tokens += r.batched_tokens;
  batched_seqs += r.batched_seqs;
  max_batch_tokens = std::max(max_batch_tokens, r.max_batch_tokens);
  prompt_tokens += r.prompt_tokens;
  generation_tokens += r.generation_tokens;
  requests_finished += r.requests_finished;
  requests_aborted += r.requests_aborted;
  preemptions += r.preemptions;
  idle_batches += r.idle_batches;
  forward_seconds += r.forward_seconds;
  comm_seconds += r.comm_seconds;
  comm_wait_seconds += r.comm_wait_seconds;
  for (size_t k = 0; k < kCollectiveKinds; ++k) {
    collectives[k].calls += r.collectives[k].calls;
    collectives[k].bytes += r.collectives[k].bytes;
    collectives[k].seconds += r.collectives[k].seconds;
  }
  spec_num_drafts += r.spec_num_drafts;
  spec_draft_tokens += r.spec_draft_tokens;
  spec_accepted_tokens += r.spec_accepted_tokens;
  spec_draft_kv_blocks_used += r.spec_draft_kv_blocks_used;
  spec_draft_seconds += r.spec_draft_seconds;
  spec_disabled_steps += r.spec_disabled_steps;
  kv_bytes_per_token = std::max(kv_bytes_per_token, r.kv_bytes_per_token);  // replicas hold the same model
  moe_experts = std::max(moe_experts, r.moe_experts);
  moe_routed_tokens += r.moe_routed_tokens;
  moe_busiest_expert_tokens += r.moe_busiest_expert_tokens;
  moe_ep_groups = std::max(moe_ep_groups, r.moe_ep_groups);
  moe_busiest_ep_group_tokens += r.moe_busiest_ep_group_tokens;
  if (spec_accepted_per_position.size() < r.spec_accepted_per_position.size()) {
    spec_accepted_per_position.resize(r.spec_accepted_per_position.size(), 0);
  }
  for (size_t i = 0; i < r.spec_accepted_per_position.size(); ++i) {
    spec_accepted_per_position[i] += r.spec_accepted_per_position[i];
  }
}

EngineStats EngineStats::since(const EngineStats& b) const {
  EngineStats d = *this;
  d.prefix_query_tokens -= b.prefix_query_tokens;
  d.prefix_hit_tokens -= b.prefix_hit_tokens;
  d.steps -= b.steps;
  d.batched_tokens -= b.batched_tokens;
  d.batched_seqs -= b.batched_seqs;
  d.prompt_tokens -= b.prompt_tokens;
  d.generation_tokens -= b.generation_tokens;
  d.requests_finished -= b.requests_finished;
  d.requests_aborted -= b.requests_aborted;
  d.preemptions -= b.preemptions;
  d.idle_batches -= b.idle_batches;
  d.forward_seconds -= b.forward_seconds;
  d.comm_seconds -= b.comm_seconds;
  d.comm_wait_seconds -= b.comm_wait_seconds;
  for (size_t k = 0; k < kCollectiveKinds; ++k) {
    d.collectives[k].calls -= b.collectives[k].calls;
    d.collectives[k].bytes -= b.collectives[k].bytes;
    d.collectives[k].seconds -= b.collectives[k].seconds;
  }
  d.spec_num_drafts -= b.spec_num_drafts;
  d.spec_draft_tokens -= b.spec_draft_tokens;
  d.spec_accepted_tokens -= b.spec_accepted_tokens;
  d.spec_draft_seconds -= b.spec_draft_seconds;
  d.spec_disabled_steps -= b.spec_disabled_steps;
  d.moe_routed_tokens -= b.moe_routed_tokens;
  d.moe_busiest_expert_tokens -= b.moe_busiest_expert_tokens;
  d.moe_busiest_ep_group_tokens -= b.moe_busiest_ep_group_tokens;
  // Positions that `before` has not seen yet count from 0.
  for (size_t i = 0; i < std::min(d.spec_accepted_per_position.size(), b.spec_accepted_per_position.size()); ++i) {
    d.spec_accepted_per_position[i] -= b.spec_accepted_per_position[i];
  }
  return d;
}

}  // namespace servetune
