// The engine settings table: every setting round-trips through JSON (both nlohmann types) and through its CLI flag;
// the reproduce command of a config parses back to it; bad keys, types and enum words are errors naming the key; the
// JSON is byte for byte what it was before the table; committed records still load.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/engine_flags.h"
#include "servetune/engine_config.h"
#include "servetune/error.h"
#include "test_paths.h"
#include "tuner/command_line.h"
#include "tuner/server_command.h"
#include "tuner/spec_file.h"
#include "tuner/sweep_spec.h"

namespace servetune {
namespace {

// Every setting away from its default (not a valid engine to run: validate() is not the point here).
EngineConfig all_changed() {
  EngineConfig c;
  c.model = "models/x.gguf";
  c.load_format = LoadFormat::kDummy;
  c.context_length = 512;
  c.device = Device::kHip;
  c.threads = 3;
  c.tp_size = 2;
  c.dp_size = 2;
  c.load_balance_method = LoadBalanceMethod::kShortestQueue;
  c.ep_size = 2;
  c.ep_num_redundant_experts = 2;
  c.init_expert_location = "location.json";
  c.comm_backend = CommBackend::kGloo;
  c.nnodes = 2;
  c.node_rank = 1;
  c.dist_init_addr = "127.0.0.1:29500";
  c.dist_timeout = 60;
  c.enable_dp_attention = true;
  c.moe_a2a_backend = MoeA2aBackend::kDeepep;
  c.compile = CompileLevel::kEager;
  c.cuda_graph_max_bs = 8;
  c.max_total_tokens = 4096;
  c.mem_fraction_static = 0.25;
  c.page_size = 32;
  c.kv_cache_dtype = KvCacheDtype::kFp8E4m3;
  c.max_running_requests = 8;
  c.chunked_prefill_size = -1;
  c.max_prefill_tokens = 1024;
  c.schedule_policy = SchedulePolicy::kLpm;
  c.disable_radix_cache = true;
  c.speculative_algorithm = SpeculativeAlgorithm::kDraft;
  c.speculative_num_steps = 3;
  c.speculative_eagle_topk = 1;
  c.speculative_num_draft_tokens = 4;
  c.speculative_draft_model = "draft dir/it's.gguf";  // needs quoting in a shell
  c.speculative_disable_by_batch_size = 16;
  c.speculative_token_map = "hot tokens.json";
  c.speculative_draft_model_quantization = DraftModelQuantization::kQ8_0;
  c.speculative_ngram_min_match_window_size = 2;
  c.speculative_ngram_max_match_window_size = 6;
  c.seed = 18446744073709551615ull;
  return c;
}

std::string dump(const EngineConfig& c) { return nlohmann::ordered_json(c).dump(); }

// The words /bin/sh makes of `command_line`, as when a reproduce command is pasted into a shell.
std::vector<std::string> shell_words(const std::string& command_line) {
  FILE* p = popen(("printf '%s\\0' " + command_line).c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed");
  std::string out;
  for (int ch; (ch = std::fgetc(p)) != EOF;) out += static_cast<char>(ch);
  EXPECT_EQ(pclose(p), 0) << command_line;
  std::vector<std::string> words;
  for (size_t at = 0; at < out.size();) {
    const size_t end = out.find('\0', at);
    words.push_back(out.substr(at, end - at));
    at = end + 1;
  }
  return words;
}

// Parses the shell command line `args` (after the subcommand) with the engine flags, as `servetune serve` does.
EngineConfig parse_flags(const std::string& args) {
  CLI::App app;
  EngineConfig c;
  cli::add_engine_flags(&app, c);
  std::vector<std::string> words = shell_words(args);
  std::reverse(words.begin(), words.end());  // CLI11 takes them last first
  app.parse(words);
  return c;
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(EngineSettingsTable, KeysAreUniqueAndFlagsLong) {
  std::set<std::string_view> keys, flags;
  for (const EngineSetting& s : engine_settings()) {
    EXPECT_TRUE(keys.insert(s.key).second) << s.key;
    EXPECT_TRUE(s.flag().starts_with("--")) << s.key;
    EXPECT_TRUE(flags.insert(s.flag()).second) << s.flag();
    EXPECT_FALSE(s.help.empty()) << s.key;
    EXPECT_EQ(find_engine_setting(s.key), &s);
  }
  EXPECT_EQ(find_engine_setting("max_batch"), nullptr);
  EXPECT_EQ(find_engine_setting("seed")->flag(), "--random-seed");
  EXPECT_EQ(find_engine_setting("tp_size")->flag(), "--tp-size");
  EXPECT_EQ(find_engine_setting("model")->flags, "--model,-m");
  EXPECT_EQ(find_engine_setting("threads")->flags, "--threads,-t");
  EXPECT_EQ(find_engine_setting("compile")->words, (std::vector<std::string_view>{"eager", "fused", "graphs"}));
  EXPECT_TRUE(find_engine_setting("threads")->words.empty());
  std::vector<std::string> in_order;
  for (const EngineSetting& s : engine_settings()) in_order.emplace_back(s.key);
  EXPECT_EQ(engine_config_keys(), in_order);
}

// Captured from the implementation before the table (commit 504d558, to_json into nlohmann::json): records, bench
// JSON and worker command lines keep these bytes (plus the settings added since: moe_a2a_backend,
// ep_num_redundant_experts, init_expert_location).
TEST(EngineSettingsTable, JsonIsByteIdenticalToBefore) {
  const std::string defaults =
      R"({"chunked_prefill_size":2048,"comm_backend":"local","compile":"fused","context_length":null,"cuda_graph_max_bs":0,)"
      R"("device":"cpu","disable_radix_cache":false,"dist_init_addr":"","dist_timeout":300,"dp_size":1,)"
      R"("enable_dp_attention":false,"ep_num_redundant_experts":0,"ep_size":1,"init_expert_location":"trivial",)"
      R"("kv_cache_dtype":"auto","load_balance_method":"round_robin","load_format":"auto","max_prefill_tokens":8192,"max_running_requests":256,"max_total_tokens":null,)"
      R"("mem_fraction_static":0.0,"model":"","moe_a2a_backend":"none","nnodes":1,"node_rank":0,"page_size":16,"schedule_policy":"fcfs","seed":0,)"
      R"("speculative_algorithm":"","speculative_disable_by_batch_size":0,"speculative_draft_model":"",)"
      R"("speculative_draft_model_quantization":"","speculative_eagle_topk":0,)"
      R"("speculative_ngram_max_match_window_size":12,"speculative_ngram_min_match_window_size":1,)"
      R"("speculative_num_draft_tokens":0,"speculative_num_steps":0,"speculative_token_map":"","threads":0,"tp_size":1})";
  EXPECT_EQ(nlohmann::json(EngineConfig{}).dump(), defaults);
  EngineConfig c = all_changed();
  c.device = Device::kCpu;
  c.threads = 2;
  c.ep_size = 1;
  c.ep_num_redundant_experts = 0;
  c.init_expert_location = "trivial";
  c.speculative_draft_model = "d.gguf";
  c.speculative_token_map = "t.json";
  const std::string changed =
      R"({"chunked_prefill_size":-1,"comm_backend":"gloo","compile":"eager","context_length":512,"cuda_graph_max_bs":8,)"
      R"("device":"cpu","disable_radix_cache":true,"dist_init_addr":"127.0.0.1:29500","dist_timeout":60,"dp_size":2,)"
      R"("enable_dp_attention":true,"ep_num_redundant_experts":0,"ep_size":1,"init_expert_location":"trivial",)"
      R"("kv_cache_dtype":"fp8_e4m3","load_balance_method":"shortest_queue","load_format":"dummy","max_prefill_tokens":1024,"max_running_requests":8,"max_total_tokens":4096,)"
      R"("mem_fraction_static":0.25,"model":"models/x.gguf","moe_a2a_backend":"deepep","nnodes":2,"node_rank":1,"page_size":32,)"
      R"("schedule_policy":"lpm","seed":18446744073709551615,"speculative_algorithm":"draft",)"
      R"("speculative_disable_by_batch_size":16,"speculative_draft_model":"d.gguf",)"
      R"("speculative_draft_model_quantization":"q8_0","speculative_eagle_topk":1,)"
      R"("speculative_ngram_max_match_window_size":6,)"
      R"("speculative_ngram_min_match_window_size":2,"speculative_num_draft_tokens":4,"speculative_num_steps":3,)"
      R"("speculative_token_map":"t.json","threads":2,"tp_size":2})";
  EXPECT_EQ(nlohmann::json(c).dump(), changed);
  // bench JSON's engine_config: the sorted object carried into the ordered record without text.
  EXPECT_EQ(nlohmann::ordered_json(nlohmann::json(c)).dump(), changed);
  // The ordered type keeps the table's order.
  const nlohmann::ordered_json ordered = c;
  std::vector<std::string> keys;
  for (const auto& [k, v] : ordered.items()) keys.push_back(k);
  EXPECT_EQ(keys, engine_config_keys());
}

TEST(EngineSettingsTable, EverySettingRoundTripsThroughJson) {
  const EngineConfig c = all_changed();
  const nlohmann::ordered_json changed = c, defaults = EngineConfig{};
  for (const auto& key : engine_config_keys()) EXPECT_NE(changed.at(key), defaults.at(key)) << key << " is not changed";
  EXPECT_EQ(dump(nlohmann::ordered_json(c).get<EngineConfig>()), dump(c));
  EXPECT_EQ(dump(nlohmann::json(c).get<EngineConfig>()), dump(c));
  // One key at a time: only that member moves.
  for (const auto& key : engine_config_keys()) {
    const EngineConfig one = nlohmann::ordered_json{{key, changed.at(key)}}.get<EngineConfig>();
    nlohmann::ordered_json expected = defaults;
    expected[key] = changed.at(key);
    EXPECT_EQ(nlohmann::ordered_json(one), expected) << key;
  }
}

TEST(EngineSettingsTable, EverySettingRoundTripsThroughItsFlag) {
  const nlohmann::ordered_json changed = all_changed(), defaults = EngineConfig{};
  for (const EngineSetting& s : engine_settings()) {
    const std::string key(s.key);
    if (key == "model") continue;
    const auto& v = changed.at(key);
    std::string args = "--model m.gguf " + std::string(s.flag());
    if (!v.is_boolean()) args += " " + tuner::shell_quote(v.is_string() ? v.get<std::string>() : v.dump());
    nlohmann::ordered_json expected = defaults;
    expected["model"] = "m.gguf";
    expected[key] = v;
    EXPECT_EQ(nlohmann::ordered_json(parse_flags(args)), expected) << args;
  }
  EXPECT_EQ(parse_flags("-m m.gguf -t 3").threads, 3);
  EXPECT_THROW(parse_flags("--tp-size 2"), CLI::RequiredError);  // --model is required
}

TEST(EngineSettingsTable, ReproduceCommandParsesBackToTheSameConfig) {
  const EngineConfig c = all_changed();
  const std::string flags = tuner::engine_flags(nlohmann::ordered_json(c));
  EXPECT_NE(flags.find("--random-seed 18446744073709551615"), std::string::npos) << flags;
  EXPECT_NE(flags.find("--speculative-draft-model 'draft dir/it'\\''s.gguf'"), std::string::npos) << flags;
  EXPECT_EQ(flags.find("--model"), std::string::npos) << flags;  // the command names the model itself
  EXPECT_EQ(dump(parse_flags("--model models/x.gguf " + flags)), dump(c)) << flags;
  // Defaults are left out; the sweep file's own spelling of a word is kept.
  EXPECT_EQ(tuner::engine_flags(nlohmann::ordered_json(EngineConfig{})), "");
  EXPECT_EQ(tuner::engine_flags({{"speculative_algorithm", "NGRAM"}, {"disable_radix_cache", false}, {"tp_size", 2}}),
            "--tp-size 2 --speculative-algorithm NGRAM");  // table order
}

TEST(EngineSettingsTable, ErrorsNameTheKey) {
  const auto json_error = [](const nlohmann::json& j) {
    EngineConfig c;
    return usage_error([&] { from_json(j, c); });
  };
  const auto has = [](const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; };
  EXPECT_EQ(json_error({{"max_batch", 8}}), "unknown engine setting 'max_batch'");
  EXPECT_EQ(json_error({{"tp_size", "two"}}), "engine setting 'tp_size' has the wrong type (string): it takes an integer");
  EXPECT_TRUE(has(json_error({{"tp_size", 2.5}}), "'tp_size' has the wrong type (number)"));
  EXPECT_TRUE(has(json_error({{"threads", 1LL << 40}}), "'threads' is out of range: 1099511627776"));
  EXPECT_TRUE(has(json_error({{"seed", -1}}), "'seed' is out of range: -1"));
  EXPECT_TRUE(has(json_error({{"disable_radix_cache", 1}}), "'disable_radix_cache' has the wrong type"));
  EXPECT_TRUE(has(json_error({{"model", nullptr}}), "'model' has the wrong type (null)"));
  EXPECT_EQ(json_error({{"compile", 2}}), "engine setting 'compile' has the wrong type (number): it takes eager, fused or graphs");
  EXPECT_EQ(json_error({{"compile", "fusd"}}), "compile must be eager, fused or graphs, got 'fusd'");
  EXPECT_EQ(json_error(nlohmann::json::array()), "engine config must be a JSON object");
  EXPECT_EQ(usage_error([&] { check_engine_setting("kv_cache_dtype", "fp8"); }),
            "kv_cache_dtype must be auto, f32, f16, bf16 or fp8_e4m3, got 'fp8'");
  EXPECT_EQ(usage_error([&] { check_engine_setting("speculative_algorithm", "medusa"); }),
            "speculative_algorithm must be ngram, draft, eagle or mtp (or empty), got 'medusa'");
  EXPECT_EQ(usage_error([&] { parse_flags("-m m --compile fusd"); }),
            "compile must be eager, fused or graphs, got 'fusd'");
  EXPECT_EQ(usage_error([&] { parse_flags("-m m --device tpu"); }), "device must be cpu, cuda or hip, got 'tpu'");
  // Null clears an optional.
  EngineConfig c;
  from_json(nlohmann::json{{"max_total_tokens", 64}}, c);
  from_json(nlohmann::json{{"max_total_tokens", nullptr}}, c);
  EXPECT_FALSE(c.max_total_tokens.has_value());
}

TEST(EngineSettingsTable, SpeculativeAlgorithmIsReadInAnyCase) {
  EXPECT_EQ(parse_speculative_algorithm("EAGLE"), SpeculativeAlgorithm::kEagle);
  EXPECT_EQ(parse_speculative_algorithm("NGram"), SpeculativeAlgorithm::kNgram);
  EXPECT_EQ(parse_speculative_algorithm(""), SpeculativeAlgorithm::kNone);
  EXPECT_EQ(parse_flags("-m m --speculative-algorithm NGRAM").speculative_algorithm, SpeculativeAlgorithm::kNgram);
  const EngineConfig c = nlohmann::json{{"speculative_algorithm", "DRAFT"}}.get<EngineConfig>();
  EXPECT_EQ(c.speculative_algorithm, SpeculativeAlgorithm::kDraft);
  EXPECT_EQ(nlohmann::json(c)["speculative_algorithm"], "draft");
  // Other settings keep their exact spelling.
  EXPECT_THROW(parse_compile_level("Fused"), Error);
}

TEST(EngineSettingsTable, SweepFilesAreCheckedAgainstTheTable) {
  const auto error_of = [](const std::string& text) {
    return usage_error([&] { tuner::parse_sweep(tuner::parse_spec_text(text, "t.yaml")); });
  };
  const std::string target = "name: t\ntarget: {engine: builtin, model: m.gguf";
  const std::string workloads = "workloads: [{name: w, dataset: random}]\n";
  EXPECT_NE(error_of(target + "}\nspace: {compile: [fused, fusd]}\n" + workloads)
                .find("t.yaml: space.compile (line 3): compile must be eager, fused or graphs, got 'fusd'"),
            std::string::npos);
  EXPECT_NE(error_of(target + ", settings: {threads: two}}\n" + workloads)
                .find("target.settings.threads (line 2): engine setting 'threads' has the wrong type (string)"),
            std::string::npos);
  EXPECT_NE(error_of(target + ", settings: {kv_cache_dtype: fp4}}\n" + workloads)
                .find("target.settings.kv_cache_dtype (line 2): kv_cache_dtype must be auto, f32, f16, bf16 or fp8_e4m3"),
            std::string::npos);
  EXPECT_NE(error_of(target + ", settings: {max_batch: 4}}\n" + workloads)
                .find("unknown engine setting 'max_batch' (known: model,"),
            std::string::npos);
  const std::string fine = target + ", settings: {speculative_algorithm: NGRAM}}\nspace: {compile: [eager, fused]}\n";
  EXPECT_NO_THROW(tuner::parse_sweep(tuner::parse_spec_text(fine + workloads, "t.yaml")));
}

// A committed record's settings (a sweep's fixed settings plus the candidate's) still make the same engine config.
TEST(EngineSettingsTable, CommittedRecordLoads) {
  std::ifstream in(testing::source_path("results/ci-perf/baseline-avx2/records/c0/mixed.r0.json"));
  ASSERT_TRUE(in) << "the committed ci-perf baseline record is missing";
  const nlohmann::ordered_json record = nlohmann::ordered_json::parse(in);
  nlohmann::ordered_json settings = record.at("candidate").at("full_settings");
  settings["model"] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  const EngineConfig c = settings.get<EngineConfig>();
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.max_running_requests, 8);
  EXPECT_EQ(c.chunked_prefill_size, 256);
  EXPECT_EQ(c.max_total_tokens, 4096);
  EXPECT_EQ(c.compile, CompileLevel::kFused);
  EXPECT_NO_THROW(c.validate());
}

}  // namespace
}  // namespace servetune
