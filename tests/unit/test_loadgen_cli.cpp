// `servetune bench` end to end: a built-in run saves vLLM's JSON keys plus the engine's; a run against the mock
// server reports its /metrics speculative-decoding counters; bad flags and bad dataset files give one clear
// message naming the input, exit code 2 for usage errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "mock_server.h"
#include "test_paths.h"

namespace {

struct Result {
  int code;
  std::string output;
};

Result run(const std::string& args) {
  const std::string cmd = std::string(SERVETUNE_BIN) + " bench " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string kModel = "-m " + servetune::testing::stories_path();

void expect_usage_error(const std::string& args, const std::string& mentions) {
  const Result r = run(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(mentions), std::string::npos) << args << "\n" << r.output;
}

TEST(BenchCli, UsageErrorsExitWith2AndNameTheInput) {
  expect_usage_error(kModel + " --backend nosuch", "--backend");
  expect_usage_error(kModel + " --dataset-name nosuch", "--dataset-name");
  expect_usage_error(kModel + " --dataset-name sharegpt --dataset-path /no/such/file.json", "/no/such/file.json");
  expect_usage_error(kModel + " --request-rate fast", "--request-rate");
  expect_usage_error(kModel + " --request-rate -1", "--request-rate");
  expect_usage_error(kModel + " --max-concurrency 0", "--max-concurrency");
  expect_usage_error(kModel + " --goodput ttft=5", "--goodput");
  expect_usage_error(kModel + " --percentile-metrics ttft,foo", "foo");
  expect_usage_error(kModel + " --random-range-ratio 1.5", "--random-range-ratio");
  expect_usage_error(kModel + " --tp-size 2", "--tp-size");  // an engine setting with an HTTP backend
  expect_usage_error(kModel + " --backend builtin --port 9000", "--port");
  expect_usage_error("-m /no/such/model.gguf", "/no/such/model.gguf");
  expect_usage_error(kModel + " --result-dir /tmp/x", "--save-result");
  expect_usage_error(kModel + " --think-time 1", "--think-time needs --multi-turn");
  expect_usage_error(kModel + " --multi-turn-turns 3", "--multi-turn-turns needs --multi-turn");
  expect_usage_error(kModel + " --multi-turn --dataset-name prefix", "--multi-turn applies to");
  expect_usage_error(kModel + " --multi-turn", "chat template");  // stories260K has none
  const std::string chatml = " --model mock --tokenizer " + servetune::testing::data_path("tokenizer/hf/qwen2");
  expect_usage_error(chatml + " --multi-turn --think-time-dist weibull", "--think-time-dist");
  expect_usage_error(chatml + " --multi-turn --think-time -1", "--think-time");
  expect_usage_error(chatml + " --multi-turn --multi-turn-history client", "--multi-turn-history");
  expect_usage_error(chatml + " --multi-turn --think-time-dist trace", "--think-time-dist trace needs --think-time-trace FILE");
  const std::string bad_trace = servetune::testing::temp_file("cli_think_bad.txt", "0.5\nlater\n");
  expect_usage_error(chatml + " --multi-turn --think-time-dist trace-replay --think-time-trace " + bad_trace,
                     bad_trace + ":2: 'later' is not a number of seconds");
  expect_usage_error(kModel + " --multi-turn-turns-dist 4", "--multi-turn-turns-dist needs --multi-turn");
  expect_usage_error(chatml + " --multi-turn --multi-turn-turns-dist zipf:alpha=2 --multi-turn-turns 3",
                     "--multi-turn-turns-dist replaces --multi-turn-turns");
  expect_usage_error(chatml + " --multi-turn --multi-turn-input-len-dist lognormal:average=0",
                     "--multi-turn-input-len-dist: lognormal's average must be >= 1");
}

TEST(BenchCli, MalformedDatasetFileIsOneClearError) {
  const auto path = std::filesystem::temp_directory_path() / "servetune_cli_bad_sharegpt.json";
  std::ofstream(path) << "[{\"conversations\": [}]";
  const Result r = run(kModel + " --dataset-name sharegpt --dataset-path " + path.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(path.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("invalid JSON"), std::string::npos) << r.output;
}

TEST(BenchCli, BuiltinRunSavesVllmKeys) {
  const auto dir = std::filesystem::temp_directory_path() / "servetune_cli_results";
  std::filesystem::remove_all(dir);
  const Result r = run(kModel + " --backend builtin --dataset-name random --random-input-len 16 --random-output-len 4"
                                " --num-prompts 6 --max-concurrency 2 --request-rate 100 --goodput ttft:10000"
                                " --save-result --result-dir " + dir.string() + " --result-filename out.json --threads 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("============ Serving Benchmark Result ============"), std::string::npos);
  EXPECT_NE(r.output.find("Successful requests:                     6 "), std::string::npos) << r.output;
  std::ifstream in(dir / "out.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  for (const char* k : {"date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness",
                        "max_concurrency", "duration", "completed", "total_input_tokens", "total_output_tokens",
                        "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms",
                        "max_concurrent_requests", "environment", "engine_config", "dataset_info"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["completed"].get<int>(), 6);
  EXPECT_EQ(j["total_output_tokens"].get<int>(), 24);
  EXPECT_EQ(j["prompt_len_mismatches"].get<int>(), 0);
  EXPECT_LE(j["max_concurrent_requests"].get<int>(), 2);
  const std::string isa = j["environment"].value("engine_cpu_isa", std::string());
  EXPECT_TRUE(servetune::cpu_isa_from_name(isa).has_value()) << isa;
  EXPECT_TRUE(j.contains("engine_steps"));
  EXPECT_TRUE(j.contains("process_cpu_s"));
  EXPECT_FALSE(j.contains("calibration_ms"));  // the sweep's CPU calibration is not part of bench's result
}

TEST(BenchCli, HttpRunReportsTheServersSpeculativeCounters) {
  const servetune::testing::MockServer server({"--spec-decode-tokens", "2"});
  const auto dir = std::filesystem::temp_directory_path() / "servetune_cli_results_http";
  std::filesystem::remove_all(dir);
  const Result r = run("--model mock --tokenizer " + servetune::testing::stories_path() + " --port " +
                       std::to_string(server.port()) + " --dataset-name random --random-input-len 16"
                       " --random-output-len 8 --num-prompts 10 --save-result --result-dir " + dir.string() +
                       " --result-filename out.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("---------------Speculative Decoding---------------"), std::string::npos) << r.output;
  std::ifstream in(dir / "out.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  // The counters' change over the run: 10 x 8 tokens, each one draft of 2 tokens with its first accepted.
  EXPECT_EQ(j["spec_decode_num_drafts"].get<int>(), 80);
  EXPECT_EQ(j["spec_decode_draft_tokens"].get<int>(), 160);
  EXPECT_EQ(j["spec_decode_accepted_tokens"].get<int>(), 80);
  EXPECT_DOUBLE_EQ(j["spec_decode_acceptance_rate"].get<double>(), 50.0);
  EXPECT_FALSE(j.contains("engine_steps"));
  EXPECT_FALSE(j.contains("engine_config"));
  std::filesystem::remove_all(dir);
}

// Two ShareGPT conversations of 3 turns: conversation c's turn k says "cC asks question K", its reply "cC gives
// reply K" (4 words each). Returns the file's path.
std::string conversations_file(const std::string& name) {
  nlohmann::json file = nlohmann::json::array();
  for (int c = 0; c < 2; ++c) {
    nlohmann::json conv = nlohmann::json::array();
    for (int k = 0; k < 3; ++k) {
      conv.push_back({{"from", "human"}, {"value", "c" + std::to_string(c) + " asks question " + std::to_string(k)}});
      conv.push_back({{"from", "gpt"}, {"value", "c" + std::to_string(c) + " gives reply " + std::to_string(k)}});
    }
    file.push_back({{"id", std::to_string(c)}, {"conversations", conv}});
  }
  return servetune::testing::temp_file(name, file.dump());
}

// Multi-turn ShareGPT against the mock's pretend prefix cache (cached = words of the longest earlier prompt a prompt
// starts with): with conversations_file's 4-word messages turn t's history has 8t + 4 words of which the previous
// turn's 8t - 4 are cached.
TEST(BenchCli, MultiTurnShareGptReportsPerTurnMetricsAndTheServersCacheHitRate) {
  const servetune::testing::MockServer server({"--prefix-cache"});
  const std::string path = conversations_file("cli_multi_turn.json");
  const auto dir = std::filesystem::temp_directory_path() / "servetune_cli_results_mt";
  std::filesystem::remove_all(dir);
  const Result r = run("--backend openai-chat --model mock --tokenizer " +
                       servetune::testing::data_path("tokenizer/hf/qwen2") + " --port " + std::to_string(server.port()) +
                       " --dataset-name sharegpt --dataset-path " + path + " --disable-shuffle --multi-turn"
                       " --num-prompts 2 --max-concurrency 1 --think-time 0.01 --save-result --result-dir " +
                       dir.string() + " --result-filename out.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Multi-turn: 2 sessions of 3.00 turns on average (history: the dataset's replies)"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("---------Multi-turn Sessions (servetune)----------"), std::string::npos) << r.output;
  std::ifstream in(dir / "out.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["completed"].get<int>(), 6);
  EXPECT_EQ(j["num_sessions"].get<int>(), 2);
  EXPECT_EQ(j["completed_sessions"].get<int>(), 2);
  EXPECT_EQ(j["later_turns_completed"].get<int>(), 4);
  EXPECT_EQ(j["mean_ttft_ms_by_turn"].size(), 3u);
  EXPECT_TRUE(j.contains("later_turns_p99_ttft_ms"));
  EXPECT_DOUBLE_EQ(j["first_turn_cached_fraction"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["later_turns_cached_fraction"].get<double>(), (4.0 + 12.0) / (12.0 + 20.0));
  EXPECT_DOUBLE_EQ(j["prefix_cache_hit_rate"].get<double>(), 2 * 16.0 / (2 * 36.0));
  EXPECT_NE(j["prefix_cache_hit_rate_source"].get<std::string>().find("vllm:prefix_cache_hits_total"), std::string::npos);
  EXPECT_EQ(j["dataset_info"]["sessions"].get<int>(), 2);
  std::filesystem::remove_all(dir);
}

// Think times replayed from a trace (0.02 s then 0.05 s, wrapping) and vLLM's multi-turn records in the detailed
// JSON: each later turn starts no earlier than its session's previous reply ended plus its think time (lower bounds
// only), input_num_turns counts the messages sent, approx_cached_percent is the history's share of them.
TEST(BenchCli, MultiTurnThinkTimesFromATraceAndVllmsPerRequestRecords) {
  const servetune::testing::MockServer server({"--prefix-cache"});
  const std::string path = conversations_file("cli_multi_turn_trace.json");
  const std::string trace = servetune::testing::temp_file("cli_think_trace.txt", "# seconds\n0.02\n0.05\n");
  const auto dir = std::filesystem::temp_directory_path() / "servetune_cli_results_mt_trace";
  std::filesystem::remove_all(dir);
  const Result r = run("--backend openai-chat --model mock --tokenizer " +
                       servetune::testing::data_path("tokenizer/hf/qwen2") + " --port " + std::to_string(server.port()) +
                       " --dataset-name sharegpt --dataset-path " + path + " --disable-shuffle --multi-turn"
                       " --num-prompts 2 --max-concurrency 2 --think-time-dist trace-replay --think-time-trace " + trace +
                       " --save-result --save-detailed --result-dir " + dir.string() + " --result-filename out.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("requests_per_sec (vLLM multi-turn):"), std::string::npos) << r.output;
  std::ifstream in(dir / "out.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  const nlohmann::json& records = j["multi_turn_requests"];
  ASSERT_EQ(records.size(), 6u);
  std::map<std::string, nlohmann::json> previous;  // conversation_id -> its last record
  double think[] = {0.02, 0.05, 0.02, 0.05};  // later turns in plan order: session 0's, then session 1's
  double last_start = 0.0;
  for (const nlohmann::json& rec : records) {
    SCOPED_TRACE(rec.dump());
    const int turn = rec["turn"].get<int>();
    const std::string conv = rec["conversation_id"].get<std::string>();
    EXPECT_GE(rec["start_time_ms"].get<double>(), last_start);  // by start time, as vLLM's raw data
    last_start = rec["start_time_ms"].get<double>();
    EXPECT_EQ(rec["input_num_turns"].get<int>(), 2 * turn + 1);
    EXPECT_DOUBLE_EQ(rec["end_time_ms"].get<double>(), rec["start_time_ms"].get<double>() + rec["latency_ms"].get<double>());
    EXPECT_GT(rec["output_num_tokens"].get<int>(), 0);
    EXPECT_EQ(rec["output_num_first_chunk_tokens"].get<int>(), 1);
    EXPECT_GE(rec["ttft_ms"].get<double>(), 0.0);
    if (turn == 0) {
      EXPECT_DOUBLE_EQ(rec["approx_cached_percent"].get<double>(), 0.0);
    } else {
      const nlohmann::json& prev = previous.at(conv);
      EXPECT_EQ(prev["turn"].get<int>(), turn - 1);
      const double wait = think[2 * std::stoi(conv) + turn - 1];
      EXPECT_GE(rec["start_time_ms"].get<double>(), prev["end_time_ms"].get<double>() + 1000.0 * wait - 1e-6);
      EXPECT_GT(rec["input_num_tokens"].get<int>(), prev["input_num_tokens"].get<int>());
      // All but the last message is history: every message of turn t-1 plus its reply.
      const double cached = rec["approx_cached_percent"].get<double>() / 100.0 * rec["input_num_tokens"].get<double>();
      EXPECT_GT(cached, prev["input_num_tokens"].get<double>() - 1e-9);
    }
    previous[conv] = rec;
  }
  EXPECT_GT(j["runtime_sec"].get<double>(), 0.0);
  EXPECT_NEAR(j["requests_per_sec"].get<double>(), 6.0 / j["runtime_sec"].get<double>(), 1e-9);
  const nlohmann::json& stats = j["multi_turn_statistics"];
  for (const char* field : {"ttft_ms", "tpot_ms", "latency_ms", "input_num_turns", "input_num_tokens", "output_num_tokens",
                            "output_num_chunks"}) {
    ASSERT_TRUE(stats.contains(field)) << field;
    EXPECT_EQ(stats[field]["count"].get<int>(), 6) << field;
    EXPECT_TRUE(stats[field].contains("90%")) << field;
    EXPECT_FALSE(stats[field].contains("99%")) << field;  // vLLM adds it from 100 requests
  }
  EXPECT_DOUBLE_EQ(stats["input_num_turns"]["mean"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(stats["input_num_turns"]["max"].get<double>(), 5.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
