// External targets end to end: the mock OpenAI server swept over a flag, its /metrics speculative-decoding
// counters in the records, and servers that fail in each way a trial is classified (did not start, out of memory,
// timed out at startup or per request, crashed, every request failed); logs land in raw/, the sweep goes on, and
// no server process outlives its candidate; and the accuracy guard on `servetune serve` candidates.
#include <chrono>
#include <map>
#include <thread>

#include "test_paths.h"
#include "tuner_cli.h"

namespace servetune::testing {
namespace {
namespace fs = std::filesystem;

TEST(TunerExternal, MockServerAndEveryFailureClass) {
  const fs::path dir = scratch("external");
  const std::string mock = SERVETUNE_MOCK_SERVER;
  write_text(dir / "s.yaml", R"(name: external
target:
  engine: external
  model: mock-model
  tokenizer: )" + stories_path() + R"(
  servers:
    ok:
      command: ")" + mock + R"( --port {port} {flags}"
      health: /v1/models
      startup_timeout_s: 20
    nostart:
      command: "echo starting on {port}; exit 3"
    oom:
      command: "echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1 # {port}"
    slow:
      command: "sleep 30.123 # {port}"
      startup_timeout_s: 1
      stop_timeout_s: 2
    crash:
      command: ")" + mock + R"( --port {port} --itl-us 20000 & pid=$!; sleep 1; kill -9 $pid; sleep 0.2"
      health: /v1/models
      startup_timeout_s: 20
      flags: {itl-us: ""}
    spec:
      command: ")" + mock + R"( --port {port} --spec-decode-tokens 3 --itl-us 300"
      health: /v1/models
      startup_timeout_s: 20
      flags: {itl-us: ""}
    stall:
      command: ")" + mock + R"( --port {port} --ttft-us 30000000"
      health: /v1/models
      startup_timeout_s: 20
      request_timeout_s: 0.5
      flags: {itl-us: ""}
    notfound:
      command: ")" + mock + R"( --port {port}"
      health: /v1/models
      endpoint: /v2/completions
      startup_timeout_s: 20
      flags: {itl-us: ""}
space:
  server: [ok, nostart, oom, slow, crash, spec, stall, notfound]
  itl-us: [0, 500]
constraints: ["server == 'ok' or itl_us == 0"]
workloads:
  - {name: w, dataset: random, input_len: 16, output_len: 100, num_prompts: 8}
)");
  const fs::path run = dir / "run";
  const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::map<std::string, nlohmann::json> by_server;
  for (const auto& e : fs::directory_iterator(run / "trials")) {
    const auto m = read_json(e.path());
    if (m["status"] == "skipped") continue;
    by_server[m["candidate_info"]["settings"]["server"].get<std::string>() + "/" + m["candidate_info"]["settings"]["itl-us"].dump()] = m;
  }
  ASSERT_EQ(by_server.size(), 9u) << r.output;
  EXPECT_EQ(by_server["ok/0"]["status"], "ok");
  EXPECT_EQ(by_server["ok/500"]["status"], "ok");
  EXPECT_NE(by_server["ok/500"]["candidate_info"]["command"].get<std::string>().find("--itl-us 500"), std::string::npos);
  EXPECT_EQ(by_server["nostart/0"]["failure"], "did_not_start");
  EXPECT_NE(by_server["nostart/0"]["reason"].get<std::string>().find("exit status 3"), std::string::npos);
  EXPECT_EQ(by_server["oom/0"]["failure"], "oom");
  EXPECT_EQ(by_server["slow/0"]["failure"], "timed_out");
  EXPECT_EQ(by_server["crash/0"]["failure"], "crashed") << by_server["crash/0"].dump();
  // The client's timeout, known as such by the load generator, against a server that never answers; every request
  // answered 404 is a candidate that ran but served nothing.
  EXPECT_EQ(by_server["stall/0"]["failure"], "timed_out") << by_server["stall/0"].dump();
  EXPECT_NE(by_server["stall/0"]["reason"].get<std::string>().find("every request of w failed"), std::string::npos);
  EXPECT_EQ(by_server["notfound/0"]["failure"], "requests_failed") << by_server["notfound/0"].dump();
  EXPECT_NE(by_server["notfound/0"]["reason"].get<std::string>().find("HTTP 404"), std::string::npos);
  // The speculating server's /metrics counters over the run: each of its 8 x 100 tokens was one draft of 3 tokens,
  // its first accepted (the mock's pretend speculator).
  const auto metrics_of = [&](const std::string& key) {
    return read_json(run / "records" / by_server[key]["candidate"].get<std::string>() / "w.r0.json")["metrics"];
  };
  const nlohmann::json spec = metrics_of("spec/0");
  EXPECT_EQ(spec["spec_decode_num_drafts"], 800) << spec.dump();
  EXPECT_EQ(spec["spec_decode_draft_tokens"], 2400);
  EXPECT_EQ(spec["spec_decode_accepted_tokens"], 800);
  EXPECT_NEAR(spec["spec_decode_acceptance_length"].get<double>(), 2.0, 1e-9);
  EXPECT_EQ(spec["spec_decode_per_position_acceptance_rates"], nlohmann::json::parse("[1.0, 0.0, 0.0]"));
  EXPECT_FALSE(metrics_of("ok/0").contains("spec_decode_num_drafts"));  // its /metrics has no such counters
  // Logs are kept per candidate, starting with the command.
  const std::string log = read_text(run / by_server["nostart/0"]["log"].get<std::string>());
  EXPECT_NE(log.find("$ echo starting on"), std::string::npos) << log;
  EXPECT_NE(log.find("starting on"), std::string::npos);
  // The fast server wins; the report says so and shows the failures with their class.
  const std::string md = read_text(run / "report.md");
  EXPECT_NE(md.find("failed (oom)"), std::string::npos) << md;
  EXPECT_NE(md.find("failed (timed_out)"), std::string::npos);
  EXPECT_NE(md.find("--itl-us 0"), std::string::npos);
  // Teardown stopped the whole process group of every server.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(process_running("sleep 30.123"));
  for (const char* key : {"ok/0", "ok/500"}) {
    const std::string cmd = by_server[key]["candidate_info"]["command"];
    EXPECT_FALSE(process_running(cmd)) << cmd;
  }
  fs::remove_all(dir);
}

// The accuracy guard on external servers: `servetune serve` candidates scored through prompt_logprobs against the
// baseline candidate's server (launched once on its own, tag "accuracy"); an FP8 KV cache's perplexity rise keeps it
// from winning. A server that ignores prompt_logprobs (the mock) stops the sweep with the URL and the field named.
TEST(TunerExternal, AccuracyGuardOnServeCandidates) {
  const fs::path dir = scratch("external_accuracy");
  const std::string head = R"(name: served
target:
  engine: external
  model: stories
  tokenizer: )" + stories_path() + R"(
  servers:
    serve:
      command: ")" + std::string(SERVETUNE_BIN) + " serve --model " + stories_path() +
                           R"( --served-model-name stories --threads 1 --port {port} {flags}"
      health: /health
      startup_timeout_s: 60
)";
  const std::string rest = R"(workloads:
  - {name: w, dataset: random, input_len: 16, output_len: 4, num_prompts: 4, seed: 1}
accuracy: {dataset: )" + data_path("perplexity/text.txt") + R"(, ctx: 128, chunks: 3, prompt_logprobs: 10}
slo: {perplexity_increase: 0.000001}
)";
  write_text(dir / "s.yaml", head + "space:\n  kv-cache-dtype: [f32, fp8_e4m3]\n" + rest);
  const fs::path run = dir / "run";
  const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto base = read_json(run / "records" / "c0" / "w.r0.json")["metrics"];
  const auto fp8 = read_json(run / "records" / "c1" / "w.r0.json")["metrics"];
  EXPECT_EQ(base["kl_vs_baseline"], 0.0);
  EXPECT_EQ(base["perplexity_increase"], 0.0);
  EXPECT_GT(fp8["kl_vs_baseline"].get<double>(), 0.0);
  EXPECT_GT(fp8["perplexity_increase"].get<double>(), 0.000001);
  const auto baseline = read_json(run / "accuracy" / "baseline.json");
  EXPECT_EQ(baseline["prompt_logprobs"], 10);
  EXPECT_NEAR(baseline["perplexity"].get<double>(), base["perplexity"].get<double>(), 1e-9);
  EXPECT_TRUE(fs::exists(run / "raw" / "c0" / "server.accuracy.log"));  // the baseline's own launch
  EXPECT_NE(read_text(run / "report.md").find("**Best: `c0`**"), std::string::npos) << read_text(run / "report.md");

  write_text(dir / "mock.yaml", R"(name: mock
target:
  engine: external
  model: mock
  tokenizer: )" + stories_path() + R"(
  servers:
    mock:
      command: ")" + std::string(SERVETUNE_MOCK_SERVER) + R"( --port {port} {flags}"
      health: /v1/models
      startup_timeout_s: 20
space:
  itl-us: [0]
)" + rest);
  const CliResult bad = servetune("sweep " + (dir / "mock.yaml").string() + " --output " + (dir / "bad").string());
  EXPECT_NE(bad.code, 0) << bad.output;
  EXPECT_NE(bad.output.find("/v1/completions: the response has no 'prompt_logprobs'"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace servetune::testing
