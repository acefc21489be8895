// Every setting of the built-in engine, named as SGLang names them, serialisable to and from JSON so the tuner can
// enumerate it and results can record it. Settings that are not implemented yet are rejected by validate(),
// never silently ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace servetune {

struct EngineConfig {
  // Model
  std::string model;                   // .gguf file or safetensors directory
  std::string load_format = "auto";    // auto | gguf | safetensors | dummy
  std::optional<int64_t> context_length;  // override of the model's context length (only smaller)
  // Device and parallelism
  std::string device = "cpu";
  int threads = 0;                     // CPU threads (0: all cores)
  int tp_size = 1;                     // tensor-parallel ranks per replica (threads in each rank: the replica's / tp_size)
  int dp_size = 1;                     // engine replicas, each with threads / dp_size, KV and running requests / dp_size
  std::string load_balance_method = "round_robin";  // round_robin | shortest_queue: how requests pick a replica
  int ep_size = 1;
  // How the tensor-parallel ranks talk: local (threads of this process) | gloo (one process per rank, on one
  // machine or several, placed by SGLang's multi-node flags below; a node's process starts its other local ranks)
  // | nccl (GPUs; not on the CPU device).
  std::string comm_backend = "local";
  int nnodes = 1;                      // gloo: machines the tp_size ranks are spread over, tp_size / nnodes processes each
  int node_rank = 0;                   // gloo: this machine's node; 0 runs the engine (scheduler), the others workers
  std::string dist_init_addr;          // gloo: HOST:PORT where node 0 serves the rendezvous store
  int dist_timeout = 300;              // seconds a rank waits for its peers (rendezvous, one collective) before failing
  bool enable_dp_attention = false;
  // eager | fused | graphs. fused is the default: SGLang's default kernels already merge QKV and gate/up and fuse the
  // residual add into RMSNorm (its --enable-torch-compile is extra); eager runs one op per step, for comparison.
  std::string compile = "fused";
  int cuda_graph_max_bs = 0;           // compile = graphs: largest decode batch captured (0: 160, as SGLang)
  // Memory
  std::optional<int64_t> max_total_tokens;  // KV capacity in tokens; overrides mem_fraction_static
  double mem_fraction_static = 0.0;    // 0: device default (CPU 0.1 of RAM; GPU 0.88)
  int page_size = 16;
  std::string kv_cache_dtype = "auto"; // auto (f32 on CPU, f16 on GPUs) | f32 | f16 | fp8_e4m3 (OCP E4M3; CPU only)
  // Scheduling
  int max_running_requests = 256;
  int chunked_prefill_size = 2048;     // -1 disables chunking
  int max_prefill_tokens = 8192;       // token budget of one step
  std::string schedule_policy = "fcfs";  // fcfs | lpm
  bool disable_radix_cache = false;    // prefix caching off
  // Speculative decoding
  std::string speculative_algorithm;   // "" | ngram | draft (eagle | mtp: not implemented yet)
  int speculative_num_steps = 0;       // draft: draft tokens proposed per step (0: 4, or num_draft_tokens - 1)
  int speculative_eagle_topk = 0;      // eagle / mtp (draft: 0 or 1)
  // ngram: draft tokens verified per step (0: 4). draft: SGLang's count, num_steps + 1 (the drafts plus the last
  // accepted token); giving both with another relation is an error.
  int speculative_num_draft_tokens = 0;
  std::string speculative_draft_model;  // draft: a model sharing the target's tokenizer (.gguf or safetensors dir)
  int speculative_ngram_min_match_window_size = 1;   // ngram: shortest suffix n-gram looked up in the context
  int speculative_ngram_max_match_window_size = 12;  // ngram: longest (tried first)
  // Misc
  uint64_t seed = 0;                   // default per-request seed base

  // Throws Error(kUsage) for a bad value and Error(kUnsupported) for a setting this build cannot honour yet.
  void validate() const;
  // The rules that combine settings with each other and with this machine (tp_size x dp_size ranks need that many
  // threads, KV capacity must leave every replica a page, ...): "" when they hold, else what is wrong. validate()
  // throws it as Error(kUsage); the tuner skips such candidates with this message.
  std::string combination_problem() const;
  // The part of combination_problem() about where the tensor-parallel ranks run (comm_backend, nnodes, node_rank,
  // dist_init_addr).
  std::string placement_problem() const;
};

void to_json(nlohmann::json& j, const EngineConfig& c);
// Unknown keys and wrong types are errors (Error(kUsage) naming the key).
void from_json(const nlohmann::json& j, EngineConfig& c);

// All setting names, for the tuner's sweep-file validation.
const std::vector<std::string>& engine_config_keys();

}  // namespace servetune
