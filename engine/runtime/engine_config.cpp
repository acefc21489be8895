// EngineConfig validation and JSON (de)serialisation with strict key checking.
#include "servetune/engine_config.h"

#include <algorithm>
#include <cctype>
#include <thread>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "comm/tcp_store.h"
#include "core/error.h"

namespace servetune {
namespace {

template <typename T>
void read(const nlohmann::json& j, const char* key, T& field) {
  auto it = j.find(key);
  if (it == j.end()) return;
  try {
    field = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw_usage(std::string("engine setting '") + key + "' has the wrong type (" + it->type_name() + ")");
  }
}

template <typename T>
void read(const nlohmann::json& j, const char* key, std::optional<T>& field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  T value{};
  read(j, key, value);
  field = value;
}

}  // namespace

const std::vector<std::string>& engine_config_keys() {
  static const std::vector<std::string> keys = {
      "model", "load_format", "context_length", "device", "threads", "tp_size", "dp_size", "load_balance_method", "ep_size", "comm_backend",
      "nnodes", "node_rank", "dist_init_addr", "dist_timeout",
      "enable_dp_attention", "compile", "cuda_graph_max_bs", "max_total_tokens", "mem_fraction_static", "page_size",
      "kv_cache_dtype", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "schedule_policy",
      "disable_radix_cache", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
      "speculative_num_draft_tokens", "speculative_draft_model", "speculative_ngram_min_match_window_size",
      "speculative_ngram_max_match_window_size", "seed"};
  return keys;
}

void to_json(nlohmann::json& j, const EngineConfig& c) {
  j = nlohmann::json{{"model", c.model},
                     {"load_format", c.load_format},
                     {"context_length", c.context_length ? nlohmann::json(*c.context_length) : nlohmann::json(nullptr)},
                     {"device", c.device},
                     {"threads", c.threads},
                     {"tp_size", c.tp_size},
                     {"dp_size", c.dp_size},
                     {"load_balance_method", c.load_balance_method},
                     {"ep_size", c.ep_size},
                     {"comm_backend", c.comm_backend},
                     {"nnodes", c.nnodes},
                     {"node_rank", c.node_rank},
                     {"dist_init_addr", c.dist_init_addr},
                     {"dist_timeout", c.dist_timeout},
                     {"enable_dp_attention", c.enable_dp_attention},
                     {"compile", c.compile},
                     {"cuda_graph_max_bs", c.cuda_graph_max_bs},
                     {"max_total_tokens", c.max_total_tokens ? nlohmann::json(*c.max_total_tokens) : nlohmann::json(nullptr)},
                     {"mem_fraction_static", c.mem_fraction_static},
                     {"page_size", c.page_size},
                     {"kv_cache_dtype", c.kv_cache_dtype},
                     {"max_running_requests", c.max_running_requests},
                     {"chunked_prefill_size", c.chunked_prefill_size},
                     {"max_prefill_tokens", c.max_prefill_tokens},
                     {"schedule_policy", c.schedule_policy},
                     {"disable_radix_cache", c.disable_radix_cache},
                     {"speculative_algorithm", c.speculative_algorithm},
                     {"speculative_num_steps", c.speculative_num_steps},
                     {"speculative_eagle_topk", c.speculative_eagle_topk},
                     {"speculative_num_draft_tokens", c.speculative_num_draft_tokens},
                     {"speculative_draft_model", c.speculative_draft_model},
                     {"speculative_ngram_min_match_window_size", c.speculative_ngram_min_match_window_size},
                     {"speculative_ngram_max_match_window_size", c.speculative_ngram_max_match_window_size},
                     {"seed", c.seed}};
}

void from_json(const nlohmann::json& j, EngineConfig& c) {
  if (!j.is_object()) throw_usage("engine config must be a JSON object");
  const auto& keys = engine_config_keys();
  for (const auto& [key, value] : j.items()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) throw_usage("unknown engine setting '" + key + "'");
  }
  read(j, "model", c.model);
  read(j, "load_format", c.load_format);
  read(j, "context_length", c.context_length);
  read(j, "device", c.device);
  read(j, "threads", c.threads);
  read(j, "tp_size", c.tp_size);
  read(j, "dp_size", c.dp_size);
  read(j, "load_balance_method", c.load_balance_method);
  read(j, "ep_size", c.ep_size);
  read(j, "comm_backend", c.comm_backend);
  read(j, "nnodes", c.nnodes);
  read(j, "node_rank", c.node_rank);
  read(j, "dist_init_addr", c.dist_init_addr);
  read(j, "dist_timeout", c.dist_timeout);
  read(j, "enable_dp_attention", c.enable_dp_attention);
  read(j, "compile", c.compile);
  read(j, "cuda_graph_max_bs", c.cuda_graph_max_bs);
  read(j, "max_total_tokens", c.max_total_tokens);
  read(j, "mem_fraction_static", c.mem_fraction_static);
  read(j, "page_size", c.page_size);
  read(j, "kv_cache_dtype", c.kv_cache_dtype);
  read(j, "max_running_requests", c.max_running_requests);
  read(j, "chunked_prefill_size", c.chunked_prefill_size);
  read(j, "max_prefill_tokens", c.max_prefill_tokens);
  read(j, "schedule_policy", c.schedule_policy);
  read(j, "disable_radix_cache", c.disable_radix_cache);
  read(j, "speculative_algorithm", c.speculative_algorithm);
  read(j, "speculative_num_steps", c.speculative_num_steps);
  read(j, "speculative_eagle_topk", c.speculative_eagle_topk);
  read(j, "speculative_num_draft_tokens", c.speculative_num_draft_tokens);
  read(j, "speculative_draft_model", c.speculative_draft_model);
  read(j, "speculative_ngram_min_match_window_size", c.speculative_ngram_min_match_window_size);
  read(j, "speculative_ngram_max_match_window_size", c.speculative_ngram_max_match_window_size);
  read(j, "seed", c.seed);
}

std::string EngineConfig::placement_problem() const {
  if (comm_backend != "gloo") {
    if (nnodes != 1 || node_rank != 0) {
      return "nnodes and node_rank place tensor-parallel ranks in several processes, which needs comm_backend gloo (comm_backend " +
             comm_backend + " runs every rank in this process)";
    }
    if (!dist_init_addr.empty()) return "dist_init_addr is the rendezvous of comm_backend gloo; comm_backend " + comm_backend + " takes none";
    return "";
  }
  if (tp_size < 2) return "comm_backend gloo connects the tensor-parallel ranks of several processes; it needs tp_size > 1";
  if (dp_size > 1) return "comm_backend gloo with dp_size > 1 is not implemented yet (the processes serve one tensor-parallel replica)";
  if (tp_size % nnodes != 0) {
    return "comm_backend gloo spreads tp_size = " + std::to_string(tp_size) + " ranks evenly over nnodes = " + std::to_string(nnodes) +
           " nodes, which does not divide it";
  }
  if (dist_init_addr.empty()) return "comm_backend gloo needs dist_init_addr: HOST:PORT where node_rank 0 serves the rendezvous";
  return "";
}

void EngineConfig::validate() const {
  auto usage = [](bool ok, const std::string& what) {
    if (!ok) throw_usage(what);
  };
  auto unsupported = [](bool ok, const std::string& what) {
    if (!ok) throw_unsupported(what);
  };
  usage(!model.empty(), "no model given (--model PATH)");
  usage(load_format == "auto" || load_format == "gguf" || load_format == "safetensors" || load_format == "dummy",
        "load_format must be auto, gguf, safetensors or dummy");
  usage(!context_length || *context_length > 0, "context_length must be positive");
  usage(threads >= 0 && threads <= 1024, "threads must be in [0, 1024]");
  usage(tp_size >= 1 && dp_size >= 1 && ep_size >= 1, "tp_size, dp_size and ep_size must be at least 1");
  usage(dp_size <= 1024 && tp_size <= 1024, "tp_size and dp_size must be at most 1024");
  usage(comm_backend == "local" || comm_backend == "gloo" || comm_backend == "nccl",
        "comm_backend must be local, gloo or nccl, got '" + comm_backend + "'");
  usage(nnodes >= 1 && nnodes <= 1024, "nnodes must be in [1, 1024]");
  usage(node_rank >= 0 && node_rank < nnodes, "node_rank must be in [0, nnodes), got " + std::to_string(node_rank) +
                                                  " with nnodes = " + std::to_string(nnodes));
  usage(dist_timeout >= 1, "dist_timeout must be at least 1 second");
  if (!dist_init_addr.empty()) parse_host_port(dist_init_addr, "dist_init_addr");
  usage(load_balance_method == "round_robin" || load_balance_method == "shortest_queue",
        "load_balance_method must be round_robin or shortest_queue, got '" + load_balance_method + "'");
  usage(compile == "eager" || compile == "fused" || compile == "graphs", "compile must be eager, fused or graphs");
  usage(cuda_graph_max_bs >= 0, "cuda_graph_max_bs must be non-negative");
  usage(!max_total_tokens || *max_total_tokens > 0, "max_total_tokens must be positive");
  usage(mem_fraction_static >= 0.0 && mem_fraction_static < 1.0, "mem_fraction_static must be in [0, 1)");
  usage(page_size >= 1 && page_size <= 1024, "page_size must be in [1, 1024]");
  usage(kv_cache_dtype == "auto" || kv_cache_dtype == "f32" || kv_cache_dtype == "f16" || kv_cache_dtype == "fp8_e4m3",
        "kv_cache_dtype must be auto, f32, f16 or fp8_e4m3");
  usage(max_running_requests >= 1, "max_running_requests must be at least 1");
  usage(chunked_prefill_size == -1 || chunked_prefill_size >= 1, "chunked_prefill_size must be positive, or -1 to disable chunking");
  usage(max_prefill_tokens >= 1, "max_prefill_tokens must be at least 1");
  usage(schedule_policy == "fcfs" || schedule_policy == "lpm", "schedule_policy must be fcfs or lpm");
  std::string algo = speculative_algorithm;
  std::transform(algo.begin(), algo.end(), algo.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  usage(algo.empty() || algo == "ngram" || algo == "draft" || algo == "eagle" || algo == "mtp",
        "speculative_algorithm must be one of ngram, draft, eagle, mtp (or empty), got '" + speculative_algorithm + "'");
  usage(speculative_num_steps >= 0 && speculative_eagle_topk >= 0 && speculative_num_draft_tokens >= 0,
        "speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens must be non-negative");
  usage(!algo.empty() || (speculative_num_steps == 0 && speculative_eagle_topk == 0 && speculative_num_draft_tokens == 0 &&
                          speculative_draft_model.empty()),
        "speculative_* settings need speculative_algorithm (--speculative-algorithm ngram|draft)");
  usage(speculative_num_draft_tokens <= 64, "speculative_num_draft_tokens must be at most 64");
  usage(speculative_num_steps <= 64, "speculative_num_steps must be at most 64");
  usage(speculative_ngram_min_match_window_size >= 1 &&
            speculative_ngram_max_match_window_size >= speculative_ngram_min_match_window_size &&
            speculative_ngram_max_match_window_size <= 1024,
        "speculative_ngram_*_match_window_size need 1 <= min <= max <= 1024");
  if (algo == "ngram") {
    usage(speculative_num_steps == 0 && speculative_eagle_topk == 0 && speculative_draft_model.empty(),
          "speculative_num_steps, speculative_eagle_topk and speculative_draft_model do not apply to ngram speculation "
          "(use speculative_num_draft_tokens)");
  }

  if (algo == "draft") {
    usage(!speculative_draft_model.empty(), "speculative_algorithm draft needs a draft model (--speculative-draft-model PATH)");
    unsupported(speculative_eagle_topk <= 1,
                "speculative_eagle_topk > 1 (tree drafts) is not implemented yet; draft speculation proposes one chain");
    // SGLang's rule with topk 1: num_draft_tokens counts the verified tokens including the last accepted one.
    usage(speculative_num_draft_tokens != 1,
          "speculative_num_draft_tokens 1 leaves no draft token (with speculative_algorithm draft it must be "
          "speculative_num_steps + 1, as in SGLang)");
    usage(speculative_num_steps == 0 || speculative_num_draft_tokens == 0 ||
              speculative_num_draft_tokens == speculative_num_steps + 1,
          "with speculative_algorithm draft, speculative_num_draft_tokens must be speculative_num_steps + 1 (SGLang's "
          "rule with topk 1: the draft tokens plus the last accepted one), got " + std::to_string(speculative_num_draft_tokens) +
              " and " + std::to_string(speculative_num_steps) + "; give either one");
  }

  if (device == "cuda" || device == "hip") {
    unsupported(backend_available(device), "device '" + device + "' needs the " + device + " build (cmake --preset " + device +
                                               "); this build has: " + available_backends());
    unsupported(tp_size == 1 && dp_size == 1,
                "tp_size or dp_size > 1 on device " + device + " is not implemented yet (one GPU per engine for now)");
  }
  unsupported(backend_available(device), "device '" + device + "' is not available (this build has: " + available_backends() + ")");
  unsupported(comm_backend != "nccl", "comm_backend nccl needs a GPU tensor-parallel group, which is not implemented yet (available: local, gloo)");
  unsupported(ep_size == 1, "ep_size > 1 (expert parallelism) needs a mixture-of-experts model, which is not implemented yet");
  unsupported(!enable_dp_attention, "enable_dp_attention is not implemented yet");
  unsupported(compile != "graphs" || device != "cpu", "compile = graphs (CUDA graphs) needs a GPU device; on cpu use eager or fused");
  usage(cuda_graph_max_bs == 0 || compile == "graphs", "cuda_graph_max_bs applies to compile = graphs only");
  unsupported(kv_cache_dtype != "fp8_e4m3" || device == "cpu",
              "kv_cache_dtype fp8_e4m3 is implemented on device cpu only (the " + device +
                  " kernels read f32 and f16 caches)");
  unsupported(algo.empty() || algo == "ngram" || algo == "draft",
              "speculative_algorithm '" + speculative_algorithm + "' is not implemented yet (available: ngram, draft)");
  const std::string problem = combination_problem();
  usage(problem.empty(), problem);
}

std::string EngineConfig::combination_problem() const {
  if (tp_size < 1 || dp_size < 1 || nnodes < 1) return "";  // a bad value, which validate() reports
  if (const std::string problem = placement_problem(); !problem.empty()) return problem;
  // The ranks this process runs: all of them with the local communicator, its node's share with gloo.
  const int64_t ranks = static_cast<int64_t>(comm_backend == "gloo" ? tp_size / nnodes : tp_size) * dp_size;
  const auto cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads > 0 && ranks > threads) {
    return "tp_size x dp_size = " + std::to_string(ranks) + " ranks need at least one thread each, but threads = " +
           std::to_string(threads);
  }
  if (threads == 0 && ranks > cores) {
    return "tp_size x dp_size = " + std::to_string(ranks) + " ranks need at least one thread each, but this machine has " +
           std::to_string(cores) + " (threads = 0 means all of them)";
  }
  if (max_total_tokens && *max_total_tokens / dp_size < page_size) {
    return "max_total_tokens = " + std::to_string(*max_total_tokens) + " split over dp_size = " + std::to_string(dp_size) +
           " replicas leaves less than one page (" + std::to_string(page_size) + " tokens) each";
  }
  if (dp_size > 1 && max_running_requests < dp_size) {
    return "max_running_requests = " + std::to_string(max_running_requests) + " is less than dp_size = " + std::to_string(dp_size) +
           " (each replica runs at least one request)";
  }
  return "";
}

}  // namespace servetune
