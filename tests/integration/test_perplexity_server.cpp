// `servetune perplexity --url` end to end through the binary: against a `servetune serve` this test starts, the
// perplexity equals the built-in engine path's (and llama-perplexity's golden); the top-K KL of a server run against
// a whole-row base is positive and at most the whole-row KL of the same numerics; and the ways it can go wrong (a
// server that ignores prompt_logprobs, K out of range, nothing listening, engine flags with --url) are one clear
// message naming the URL or the flag.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "child_process.h"
#include "integration/tuner/tuner_cli.h"
#include "loadgen/http_request.h"
#include "test_paths.h"
#include "unit/mock_server.h"

extern char** environ;

namespace servetune::testing {
namespace {

// The JSON `servetune perplexity --json` printed.
nlohmann::json json_of(const CliResult& r) { return nlohmann::json::parse(r.output.substr(r.output.find('{'))); }

// `servetune serve` on stories260K (served as "stories") on a free port, with extra flags; stopped when it goes.
class Serve {
 public:
  explicit Serve(const std::vector<std::string>& extra = {}) : port_(free_port()) {
    std::vector<std::string> args = {SERVETUNE_BIN, "serve", "--model", stories_path(), "--served-model-name", "stories",
                                     "--port", std::to_string(port_), "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // liveness bound, not a timing check
    while (pid_ > 0 && !loadgen::http_get(url() + "/health", 1000) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~Serve() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  pid_t pid_ = -1;
};

const std::string kText = " --dataset " + data_path("perplexity/text.txt") + " --json";

std::string server_flags(const Serve& s) { return "perplexity --url " + s.url() + " --model stories --tokenizer " + stories_path(); }

TEST(PerplexityServer, UrlEqualsTheEnginePathAndLlamaPerplexity) {
  const Serve serve;
  const CliResult engine = servetune("perplexity --model " + stories_path() + " --ctx 128" + kText);
  const CliResult server = servetune(server_flags(serve) + " --ctx 128" + kText);
  ASSERT_EQ(engine.code, 0) << engine.output;
  ASSERT_EQ(server.code, 0) << server.output;
  const auto e = json_of(engine), s = json_of(server);
  EXPECT_EQ(s["url"], serve.url() + "/v1/completions");
  EXPECT_EQ(s["scored_tokens"], e["scored_tokens"]);
  EXPECT_NEAR(s["perplexity"].get<double>() / e["perplexity"].get<double>(), 1.0, 1e-9);
  EXPECT_NEAR(s["perplexity_error"].get<double>() / e["perplexity_error"].get<double>(), 1.0, 1e-6);
  std::ifstream golden_file(data_path("perplexity/llama_perplexity.json"));
  const auto golden = nlohmann::json::parse(golden_file)["runs"][0];
  ASSERT_EQ(golden["ctx"], 128);
  EXPECT_NEAR(s["perplexity"].get<double>() / golden["ppl"].get<double>(), 1.0, 0.005);
}

// A server with an FP8 KV cache: the same perplexity as the engine with one; its top-K KL against an f32 engine base
// is positive and no more than the engine's whole-row KL against that base (the top-K KL is a lower bound); a
// server run against its own saved top-K rows gives 0.
TEST(PerplexityServer, TopKKlAgainstAWholeRowBase) {
  const auto dir = scratch("ppl_url");
  const std::string base = (dir / "f32.logprobs").string(), own = (dir / "server.logprobs").string();
  const std::string engine = "perplexity --model " + stories_path() + " --ctx 128 --chunks 8";
  ASSERT_EQ(servetune(engine + " --kv-cache-dtype f32 --save-logprobs " + base + kText).code, 0);
  const CliResult fp8 = servetune(engine + " --kv-cache-dtype fp8_e4m3 --kl-base " + base + kText);
  const Serve serve({"--kv-cache-dtype", "fp8_e4m3"});
  const CliResult server = servetune(server_flags(serve) + " --ctx 128 --chunks 8 --save-logprobs " + own + " --kl-base " + base + kText);
  ASSERT_EQ(fp8.code, 0) << fp8.output;
  ASSERT_EQ(server.code, 0) << server.output;
  const auto f = json_of(fp8), s = json_of(server);
  EXPECT_FALSE(f["kl_top_k"].get<bool>());
  EXPECT_TRUE(s["kl_top_k"].get<bool>());
  EXPECT_NEAR(s["perplexity"].get<double>() / f["perplexity"].get<double>(), 1.0, 1e-9);
  EXPECT_NEAR(s["delta_perplexity"].get<double>(), f["delta_perplexity"].get<double>(), 1e-6);
  EXPECT_GT(s["kl_mean"].get<double>(), 0.0);
  EXPECT_LE(s["kl_mean"].get<double>(), f["kl_mean"].get<double>() + 1e-9);
  EXPECT_LE(s["kl_max"].get<double>(), f["kl_max"].get<double>() + 1e-9);
  EXPECT_EQ(s["top1_agreement"], f["top1_agreement"]);  // both know each position's most likely token
  const CliResult self = servetune(server_flags(serve) + " --ctx 128 --chunks 8 --kl-base " + own + kText);
  ASSERT_EQ(self.code, 0) << self.output;
  EXPECT_EQ(json_of(self)["kl_mean"], 0.0);
  EXPECT_EQ(json_of(self)["delta_perplexity"], 0.0);
  std::filesystem::remove_all(dir);
}

void expect_failure(const CliResult& r, int code, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.code, code) << r.output;
  for (const auto& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << "wanted '" << n << "' in:\n" << r.output;
}

TEST(PerplexityServer, BadInputsNameTheUrlOrTheFlag) {
  const std::string text = " --dataset " + data_path("perplexity/text.txt") + " --ctx 64 --chunks 2";
  const MockServer mock;  // answers without prompt_logprobs, as a server without vLLM's extension does
  const std::string mock_url = mock.url("/v1/completions");
  expect_failure(servetune("perplexity --url " + mock.url("") + " --model mock --tokenizer " + stories_path() + text), 1,
                 {mock_url, "no 'prompt_logprobs'"});
  const Serve serve;
  expect_failure(servetune(server_flags(serve) + " --prompt-logprobs 21" + text), 1,
                 {serve.url() + "/v1/completions", "HTTP 400", "'prompt_logprobs' must be in [0, 20], got 21"});
  expect_failure(servetune(server_flags(serve) + " --prompt-logprobs 0" + text), 2, {"--prompt-logprobs must be at least 1"});
  expect_failure(servetune(server_flags(serve) + " --kv-cache-dtype f16" + text), 2, {"--kv-cache-dtype is an engine setting"});
  expect_failure(servetune("perplexity --url " + serve.url() + " --model stories" + text), 2, {"--model stories: no such file"});
  const std::string nobody = "http://127.0.0.1:" + std::to_string(free_port());
  expect_failure(servetune("perplexity --url " + nobody + " --tokenizer " + stories_path() + text), 1, {nobody + "/v1/completions"});
  expect_failure(servetune("perplexity --model " + stories_path() + " --prompt-logprobs 5" + text), 2, {"--prompt-logprobs applies with --url"});
}

}  // namespace
}  // namespace servetune::testing
