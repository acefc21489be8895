// The per-request records and summary of vLLM's multi-turn benchmark (benchmarks/multi_turn/
// benchmark_serving_multi_turn.py: RequestStats, runtime_sec, requests_per_sec, its describe() table), under its
// names, computed from a multi-turn run's outputs; successful requests only, as vLLM records only those.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/client.h"

namespace servetune::loadgen {

struct VllmTurnStats {  // vLLM's RequestStats fields (client_id has no counterpart: one client sends every session)
  double ttft_ms = 0.0;         // to the first chunk, less (first-chunk tokens - 1) x tpot_ms when it held several
  double tpot_ms = 0.0;         // (latency - ttft) / (output tokens - first-chunk tokens); 0 for one chunk
  double latency_ms = 0.0;      // to the last content chunk (vLLM: to [DONE])
  double start_time_ms = 0.0;   // on the run's clock (vLLM: perf_counter)
  int64_t input_num_turns = 0;  // messages sent, the system message included
  int64_t input_num_tokens = 0;  // tokens of the messages' contents, no chat template
  int64_t output_num_tokens = 0;
  int64_t output_num_chunks = 0;  // content chunks after the first (vLLM's len(chunk_delay))
  int64_t output_num_first_chunk_tokens = 0;  // known in-process; 1 over HTTP (servetune does not tokenize chunks)
  double approx_cached_percent = 0.0;  // 100 x history tokens (all but the last message) / input_num_tokens
  std::string conversation_id;         // the session index
  int64_t turn = 0;                    // servetune's: the turn index from 0
};

// One record per successful request of `run` (in plan order). `spec` is the run's plan: its samples' messages are
// what was sent, with the session's earlier replies in place of the dataset's when spec.render is set (history
// "server"). count_tokens: tokens of a text without special tokens, as vLLM's tokenizer call.
std::vector<VllmTurnStats> vllm_turn_stats(const RunSpec& spec, const RunResult& run,
                                           const std::function<int64_t(const std::string&)>& count_tokens);

// runtime_sec (the end of the last-started request minus the first start, as vLLM), requests_per_sec and
// multi_turn_statistics: per field count, mean, std (ddof 1), min, 25%, 50%, 75%, 90%, max, with 99% from 100
// records, 99.9% from 1000, 99.99% from 10000 (pandas describe()'s labels, as vLLM prints them).
nlohmann::ordered_json vllm_multi_turn_summary(const std::vector<VllmTurnStats>& records);
// The records by start time (vLLM's raw data, with its end_time_ms), each under RequestStats' names plus turn.
nlohmann::ordered_json vllm_multi_turn_requests(const std::vector<VllmTurnStats>& records);

}  // namespace servetune::loadgen
