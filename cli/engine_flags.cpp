// Engine setting flags (see engine_flags.h).
#include "engine_flags.h"

namespace servetune::cli {

void add_engine_flags(CLI::App* cmd, EngineConfig& c) {
  cmd->add_option("--model,-m", c.model, "Model: a .gguf file or a directory with config.json + safetensors")->required();
  auto* g = "Engine settings";
  cmd->add_option("--load-format", c.load_format, "auto | gguf | safetensors | dummy")->group(g);
  cmd->add_option("--context-length", c.context_length, "Use a context shorter than the model's")->group(g);
  cmd->add_option("--device", c.device, "cpu | cuda (the cuda preset build) | hip (the hip preset build)")->group(g);
  cmd->add_option("--threads,-t", c.threads, "CPU threads (0: all cores)")->group(g);
  cmd->add_option("--tp-size", c.tp_size, "Tensor-parallel size")->group(g);
  cmd->add_option("--dp-size", c.dp_size, "Data-parallel size: engine replicas, each with threads / dp-size")->group(g);
  cmd->add_option("--load-balance-method", c.load_balance_method, "round_robin | shortest_queue (how requests pick a replica)")->group(g);
  cmd->add_option("--ep-size", c.ep_size, "Expert-parallel size")->group(g);
  cmd->add_option("--comm-backend", c.comm_backend,
                  "local (tensor-parallel ranks are threads) | gloo (one process per rank; a node's process starts its "
                  "other ranks) | nccl")->capture_default_str()->group(g);
  cmd->add_option("--nnodes", c.nnodes, "gloo: nodes the tensor-parallel ranks are spread over (tp-size / nnodes each)")
      ->capture_default_str()->group(g);
  cmd->add_option("--node-rank", c.node_rank, "gloo: this process's node (0: the engine; others: `serve` runs a worker)")
      ->capture_default_str()->group(g);
  cmd->add_option("--dist-init-addr", c.dist_init_addr, "gloo: HOST:PORT where node 0 serves the rendezvous")->group(g);
  cmd->add_option("--dist-timeout", c.dist_timeout, "Seconds a rank waits for its peers before failing")->capture_default_str()->group(g);
  cmd->add_flag("--enable-dp-attention", c.enable_dp_attention, "Data-parallel attention")->group(g);
  cmd->add_option("--compile", c.compile, "eager | fused (default) | graphs")->group(g);
  cmd->add_option("--cuda-graph-max-bs", c.cuda_graph_max_bs, "compile = graphs: largest decode batch captured in a graph (0: 160)")->group(g);
  cmd->add_option("--max-total-tokens", c.max_total_tokens, "KV cache capacity in tokens")->group(g);
  cmd->add_option("--mem-fraction-static", c.mem_fraction_static, "Fraction of memory for weights + KV (0: default)")->group(g);
  cmd->add_option("--page-size", c.page_size, "Tokens per KV block")->group(g);
  cmd->add_option("--kv-cache-dtype", c.kv_cache_dtype, "auto | f32 | f16 | fp8_e4m3")->group(g);
  cmd->add_option("--max-running-requests", c.max_running_requests, "Most sequences in one batch")->group(g);
  cmd->add_option("--chunked-prefill-size", c.chunked_prefill_size, "Most prefill tokens of one request per step (-1: no chunking)")->group(g);
  cmd->add_option("--max-prefill-tokens", c.max_prefill_tokens, "Token budget of one step")->group(g);
  cmd->add_option("--schedule-policy", c.schedule_policy, "fcfs | lpm")->group(g);
  cmd->add_flag("--disable-radix-cache", c.disable_radix_cache, "Turn prefix caching off")->group(g);
  cmd->add_option("--speculative-algorithm", c.speculative_algorithm, "ngram | draft (eagle | mtp: not implemented yet)")->group(g);
  cmd->add_option("--speculative-num-steps", c.speculative_num_steps, "draft: draft tokens proposed per step (0: 4)")->group(g);
  cmd->add_option("--speculative-eagle-topk", c.speculative_eagle_topk, "Tree branching per draft step (eagle / mtp)")->group(g);
  cmd->add_option("--speculative-num-draft-tokens", c.speculative_num_draft_tokens,
                  "ngram: draft tokens verified per step (0: 4); draft: num-steps + 1 (SGLang)")->group(g);
  cmd->add_option("--speculative-draft-model", c.speculative_draft_model, "draft: a smaller model with the same tokenizer (.gguf or safetensors dir)")->group(g);
  cmd->add_option("--speculative-ngram-min-match-window-size", c.speculative_ngram_min_match_window_size,
                  "ngram: shortest context suffix looked up")->capture_default_str()->group(g);
  cmd->add_option("--speculative-ngram-max-match-window-size", c.speculative_ngram_max_match_window_size,
                  "ngram: longest context suffix looked up (tried first)")->capture_default_str()->group(g);
  cmd->add_option("--random-seed", c.seed, "Seed base for requests without a seed")->group(g);
}

}  // namespace servetune::cli
