// The engine settings table as data, EngineConfig's strict JSON (both nlohmann types, from the same table) and its
// validation rules. JSON reading checks each value's type and range against the member it fills.
#include "servetune/engine_config.h"

#include <algorithm>
#include <filesystem>
#include <thread>
#include <utility>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "comm/tcp_store.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace servetune {
namespace {

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <typename T>
std::vector<std::string_view> words_of() {
  std::vector<std::string_view> out;
  if constexpr (SettingEnumType<T>) {
    for (const auto& s : SettingEnum<T>::kSpellings) out.push_back(s.text);
  }
  return out;
}

template <typename J>
[[noreturn]] void wrong_type(std::string_view key, const J& v, const std::string& takes) {
  throw_usage("engine setting '" + std::string(key) + "' has the wrong type (" + v.type_name() + "): it takes " +
              takes);
}

template <typename J, typename T>
void read_value(const J& v, std::string_view key, T& out) {
  if constexpr (IsOptional<T>::value) {
    if (v.is_null()) {
      out.reset();
      return;
    }
    typename T::value_type x{};
    read_value(v, key, x);
    out = x;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wrong_type(key, v, "true or false");
    out = v.template get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) wrong_type(key, v, "an integer");
    const bool fits = v.is_number_unsigned() ? std::in_range<T>(v.template get<uint64_t>())
                                             : std::in_range<T>(v.template get<int64_t>());
    if (!fits) throw_usage("engine setting '" + std::string(key) + "' is out of range: " + v.dump());
    out = v.template get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) wrong_type(key, v, "a number");
    out = v.template get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) wrong_type(key, v, "text");
    out = v.template get<std::string>();
  } else {
    static_assert(SettingEnumType<T>, "a setting's type is bool, an integer, double, std::string, an enum or optional");
    if (!v.is_string()) wrong_type(key, v, allowed_words<T>());
    out = parse_setting_enum<T>(v.template get_ref<const std::string&>());
  }
}

template <typename J, typename T>
J json_value(const T& v) {
  if constexpr (IsOptional<T>::value) {
    return v ? json_value<J>(*v) : J(nullptr);
  } else if constexpr (SettingEnumType<T>) {
    return J(to_string(v));
  } else {
    return J(v);
  }
}

template <typename J>
void write_config(J& j, const EngineConfig& c) {
  j = J::object();
  for_each_setting(c, [&](const EngineSetting& s, const auto& member) {
    j[std::string(s.key)] = json_value<J>(member);
  });
}

template <typename J>
void read_config(const J& j, EngineConfig& c) {
  if (!j.is_object()) throw_usage("engine config must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (find_engine_setting(key) == nullptr) throw_usage("unknown engine setting '" + key + "'");
  }
  for_each_setting(c, [&](const EngineSetting& s, auto& member) {
    const auto it = j.find(std::string(s.key));
    if (it != j.end()) read_value(*it, s.key, member);
  });
}

}  // namespace

void throw_bad_word(std::string_view key, const std::string& allowed, std::string_view text) {
  throw_usage(std::string(key) + " must be " + allowed + ", got '" + std::string(text) + "'");
}

// The table lists the long flag first.
std::string_view EngineSetting::flag() const { return flags.substr(0, flags.find(',')); }

const std::vector<EngineSetting>& engine_settings() {
  static const std::vector<EngineSetting> table = {
#define SERVETUNE_ENGINE_SETTING(name, type, value, flags, help) {#name, flags, help, words_of<type>()},
#include "servetune/engine_settings.inc"
#undef SERVETUNE_ENGINE_SETTING
  };
  return table;
}

const EngineSetting* find_engine_setting(std::string_view key) {
  for (const EngineSetting& s : engine_settings()) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

const std::vector<std::string>& engine_config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const EngineSetting& s : engine_settings()) out.emplace_back(s.key);
    return out;
  }();
  return keys;
}

void to_json(nlohmann::json& j, const EngineConfig& c) { write_config(j, c); }
void to_json(nlohmann::ordered_json& j, const EngineConfig& c) { write_config(j, c); }
void from_json(const nlohmann::json& j, EngineConfig& c) { read_config(j, c); }
void from_json(const nlohmann::ordered_json& j, EngineConfig& c) { read_config(j, c); }

void check_engine_setting(const std::string& key, const nlohmann::ordered_json& value) {
  if (find_engine_setting(key) == nullptr) throw_usage("unknown engine setting '" + key + "'");
  EngineConfig probe;
  read_config(nlohmann::ordered_json{{key, value}}, probe);
}

std::string EngineConfig::placement_problem() const {
  if (comm_backend != CommBackend::kGloo) {
    if (nnodes != 1 || node_rank != 0) {
      return "nnodes and node_rank place tensor-parallel ranks in several processes, which needs comm_backend gloo (comm_backend " +
             to_string(comm_backend) + " runs every rank in this process)";
    }
    if (!dist_init_addr.empty()) {
      return "dist_init_addr is the rendezvous of comm_backend gloo; comm_backend " + to_string(comm_backend) +
             " takes none";
    }
    return "";
  }
  if (tp_size < 2) return "comm_backend gloo connects the tensor-parallel ranks of several processes; it needs tp_size > 1";
  if (dp_size > 1 && !enable_dp_attention) {
    return "comm_backend gloo with dp_size > 1 is not implemented yet (the processes serve one tensor-parallel replica; with "
           "enable_dp_attention they serve dp_size = tp_size attention replicas)";
  }
  if (tp_size % nnodes != 0) {
    return "comm_backend gloo spreads tp_size = " + std::to_string(tp_size) + " ranks evenly over nnodes = " + std::to_string(nnodes) +
           " nodes, which does not divide it";
  }
  if (dist_init_addr.empty()) return "comm_backend gloo needs dist_init_addr: HOST:PORT where node_rank 0 serves the rendezvous";
  return "";
}

// Draft trees (speculative_eagle_topk > 1): SGLang's shape rules, and where tree verification runs (every device's
// attention takes tree masks; compile = graphs runs tree batches eagerly).
namespace {

void validate_draft_tree(const EngineConfig& c) {
  auto usage = [](bool ok, const std::string& what) {
    if (!ok) throw_usage(what);
  };
  const int64_t topk = c.speculative_eagle_topk;
  usage(topk <= 16, "speculative_eagle_topk must be at most 16");
  const int64_t steps = c.speculative_num_steps > 0 ? c.speculative_num_steps : 5;  // speculator.cpp's tree defaults
  const int64_t candidates = topk + (steps - 1) * topk * topk;
  const int64_t nodes = c.speculative_num_draft_tokens > 0 ? c.speculative_num_draft_tokens : std::min<int64_t>(8, candidates + 1);
  // The head's tree holds (steps - 1) x topk expanded nodes, the target's `nodes`: one 64-bit ancestor mask each.
  usage((steps - 1) * topk <= 64, "speculative_eagle_topk x (speculative_num_steps - 1) must be at most 64 (the draft "
                                  "head's tree), got " + std::to_string(topk) + " x " + std::to_string(steps - 1));
  usage(nodes - 1 <= candidates, "speculative_num_draft_tokens " + std::to_string(nodes) + " exceeds the tree's " +
                                     std::to_string(candidates) + " candidates + 1 (topk + (num_steps - 1) x topk^2, "
                                     "plus the root)");
}

}  // namespace

void EngineConfig::validate() const {
  auto usage = [](bool ok, const std::string& what) {
    if (!ok) throw_usage(what);
  };
  auto unsupported = [](bool ok, const std::string& what) {
    if (!ok) throw_unsupported(what);
  };
  usage(!model.empty(), "no model given (--model PATH)");
  usage(!context_length || *context_length > 0, "context_length must be positive");
  usage(threads >= 0 && threads <= 1024, "threads must be in [0, 1024]");
  usage(tp_size >= 1 && dp_size >= 1 && ep_size >= 1, "tp_size, dp_size and ep_size must be at least 1");
  usage(dp_size <= 1024 && tp_size <= 1024 && ep_size <= 1024, "tp_size, dp_size and ep_size must be at most 1024");
  usage(ep_num_redundant_experts >= 0 && ep_num_redundant_experts <= 65536,
        "ep_num_redundant_experts must be in [0, 65536], got " + std::to_string(ep_num_redundant_experts));
  usage(ep_num_redundant_experts == 0 || ep_size > 1,
        "ep_num_redundant_experts copies hot experts onto other expert-parallel groups; it needs ep_size > 1");
  usage(init_expert_location == "trivial" || ep_size > 1,
        "init_expert_location places the experts over the expert-parallel groups; it needs ep_size > 1");
  if (init_expert_location != "trivial") {
    std::error_code ec;
    usage(std::filesystem::is_regular_file(init_expert_location, ec),
          "init_expert_location " + init_expert_location + ": no such file (give 'trivial' or a JSON file)");
  }
  usage(nnodes >= 1 && nnodes <= 1024, "nnodes must be in [1, 1024]");
  usage(node_rank >= 0 && node_rank < nnodes, "node_rank must be in [0, nnodes), got " + std::to_string(node_rank) +
                                                  " with nnodes = " + std::to_string(nnodes));
  usage(dist_timeout >= 1, "dist_timeout must be at least 1 second");
  if (!dist_init_addr.empty()) parse_host_port(dist_init_addr, "dist_init_addr");
  usage(cuda_graph_max_bs >= 0, "cuda_graph_max_bs must be non-negative");
  usage(!max_total_tokens || *max_total_tokens > 0, "max_total_tokens must be positive");
  usage(mem_fraction_static >= 0.0 && mem_fraction_static < 1.0, "mem_fraction_static must be in [0, 1)");
  usage(page_size >= 1 && page_size <= 1024, "page_size must be in [1, 1024]");
  usage(max_running_requests >= 1, "max_running_requests must be at least 1");
  usage(chunked_prefill_size == -1 || chunked_prefill_size >= 1, "chunked_prefill_size must be positive, or -1 to disable chunking");
  usage(max_prefill_tokens >= 1, "max_prefill_tokens must be at least 1");
  const SpeculativeAlgorithm algo = speculative_algorithm;
  usage(speculative_num_steps >= 0 && speculative_eagle_topk >= 0 && speculative_num_draft_tokens >= 0,
        "speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens must be non-negative");
  usage(algo != SpeculativeAlgorithm::kNone || (speculative_num_steps == 0 && speculative_eagle_topk == 0 &&
                                                 speculative_num_draft_tokens == 0 && speculative_draft_model.empty()),
        "speculative_* settings need speculative_algorithm (--speculative-algorithm ngram|draft|mtp)");
  usage(speculative_num_draft_tokens <= 64, "speculative_num_draft_tokens must be at most 64");
  usage(speculative_num_steps <= 64, "speculative_num_steps must be at most 64");
  usage(speculative_ngram_min_match_window_size >= 1 &&
            speculative_ngram_max_match_window_size >= speculative_ngram_min_match_window_size &&
            speculative_ngram_max_match_window_size <= 1024,
        "speculative_ngram_*_match_window_size need 1 <= min <= max <= 1024");
  if (algo == SpeculativeAlgorithm::kNgram) {
    usage(speculative_num_steps == 0 && speculative_eagle_topk == 0 && speculative_draft_model.empty(),
          "speculative_num_steps, speculative_eagle_topk and speculative_draft_model do not apply to ngram speculation "
          "(use speculative_num_draft_tokens)");
  }

  if (algo == SpeculativeAlgorithm::kDraft) {
    usage(!speculative_draft_model.empty(), "speculative_algorithm draft needs a draft model (--speculative-draft-model PATH)");
  }
  if (algo == SpeculativeAlgorithm::kMtp) {
    usage(speculative_draft_model.empty(),
          "speculative_algorithm mtp drafts with the model's own multi-token-prediction layer and takes no draft model; "
          "an EAGLE head is --speculative-algorithm EAGLE --speculative-draft-model DIR");
  }
  if (algo == SpeculativeAlgorithm::kDraft || algo == SpeculativeAlgorithm::kEagle || algo == SpeculativeAlgorithm::kMtp) {
    const std::string name = to_string(algo);
    unsupported(speculative_eagle_topk <= 1 || algo != SpeculativeAlgorithm::kDraft,
                "speculative_eagle_topk > 1 (tree drafts) is implemented for the eagle and mtp draft heads; draft "
                "speculation proposes one chain");
    // SGLang's rule with topk 1: num_draft_tokens counts the verified tokens including the last accepted one.
    usage(speculative_num_draft_tokens != 1,
          "speculative_num_draft_tokens 1 leaves no draft token (with speculative_algorithm " + name +
              " it must be speculative_num_steps + 1, as in SGLang)");
    if (speculative_eagle_topk > 1) validate_draft_tree(*this);
    usage(speculative_eagle_topk > 1 || speculative_num_steps == 0 || speculative_num_draft_tokens == 0 ||
              speculative_num_draft_tokens == speculative_num_steps + 1,
          "with speculative_algorithm " + name + ", speculative_num_draft_tokens must be speculative_num_steps + 1 (SGLang's "
          "rule with topk 1: the draft tokens plus the last accepted one), got " + std::to_string(speculative_num_draft_tokens) +
              " and " + std::to_string(speculative_num_steps) + "; give either one");
  }
  const bool draft_head = algo == SpeculativeAlgorithm::kEagle || algo == SpeculativeAlgorithm::kMtp;
  usage(speculative_token_map.empty() || draft_head,
        "speculative_token_map restricts a draft head's vocabulary: it needs speculative_algorithm EAGLE or mtp");
  if (speculative_draft_model_quantization != DraftModelQuantization::kNone) {
    usage(draft_head, "speculative_draft_model_quantization applies to draft heads: it needs speculative_algorithm EAGLE or mtp");
    unsupported(device == Device::kCpu, "speculative_draft_model_quantization q8_0 is implemented on device cpu only "
                                        "(the draft heads run there)");
  }
  usage(speculative_disable_by_batch_size >= 0, "speculative_disable_by_batch_size must be non-negative (0: never)");
  usage(algo != SpeculativeAlgorithm::kNone || speculative_disable_by_batch_size == 0,
        "speculative_disable_by_batch_size needs speculative_algorithm");

  const std::string device_name = to_string(device);
  if (device != Device::kCpu) {
    unsupported(backend_available(device_name), "device '" + device_name + "' needs the " + device_name +
                                                    " build (cmake --preset " + device_name + "); this build has: " +
                                                    available_backends());
    unsupported(tp_size == 1 && dp_size == 1,
                "tp_size or dp_size > 1 on device " + device_name +
                    " is not implemented yet (one GPU per engine for now)");
  }
  unsupported(comm_backend != CommBackend::kNccl,
              "comm_backend nccl needs a GPU tensor-parallel group, which is not implemented yet (available: local, gloo)");
  if (enable_dp_attention) {
    usage(dp_size > 1, "enable_dp_attention splits the tp_size ranks into dp_size attention replicas; it needs dp_size > 1");
    unsupported(dp_size == tp_size, "enable_dp_attention with dp_size " + std::to_string(dp_size) + " < tp_size " + std::to_string(tp_size) +
                                        " (tensor-parallel attention inside each replica) is not implemented yet; use dp_size = tp_size");
  }
  // Without DP attention every tensor-parallel rank holds every token, so there is nothing to dispatch.
  unsupported(moe_a2a_backend == MoeA2aBackend::kNone || enable_dp_attention,
              "moe_a2a_backend " + to_string(moe_a2a_backend) +
                  " dispatches each DP-attention rank's tokens to their experts' ranks; it needs enable_dp_attention");
  unsupported(compile != CompileLevel::kGraphs || device != Device::kCpu,
              "compile = graphs (CUDA graphs) needs a GPU device; on cpu use eager or fused");
  usage(cuda_graph_max_bs == 0 || compile == CompileLevel::kGraphs,
        "cuda_graph_max_bs applies to compile = graphs only");
  unsupported(kv_cache_dtype != KvCacheDtype::kFp8E4m3 || device == Device::kCpu,
              "kv_cache_dtype fp8_e4m3 is implemented on device cpu only (the " + device_name +
                  " kernels read f32 and f16 caches)");
  const std::string problem = combination_problem();
  usage(problem.empty(), problem);
}

std::string EngineConfig::combination_problem() const {
  if (tp_size < 1 || dp_size < 1 || ep_size < 1 || nnodes < 1) return "";  // a bad value, which validate() reports
  if (const std::string problem = placement_problem(); !problem.empty()) return problem;
  if (tp_size % ep_size != 0) {
    // SGLang's layout: the tp_size ranks form ep_size expert groups of moe_tp = tp_size / ep_size ranks each.
    return "ep_size = " + std::to_string(ep_size) + " does not divide tp_size = " + std::to_string(tp_size) +
           " (expert parallelism splits the tensor-parallel ranks into ep_size groups: moe_tp x ep_size = tp_size)";
  }
  // The ranks this process runs: all of them with the local communicator, its node's share with gloo.
  // With DP attention the dp_size replicas are the tp_size ranks themselves.
  const int64_t node_ranks = comm_backend == CommBackend::kGloo ? tp_size / nnodes : tp_size;
  const int64_t ranks = enable_dp_attention ? node_ranks : node_ranks * dp_size;
  const std::string ranks_named = enable_dp_attention ? "tp_size" : "tp_size x dp_size";
  const auto cores = static_cast<int64_t>(available_cpus());
  if (threads > 0 && ranks > threads) {
    return ranks_named + " = " + std::to_string(ranks) + " ranks need at least one thread each, but threads = " +
           std::to_string(threads);
  }
  if (threads == 0 && ranks > cores) {
    return ranks_named + " = " + std::to_string(ranks) + " ranks need at least one thread each, but this machine has " +
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
