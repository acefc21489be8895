// `servetune import` on hand-written examples of every input format (tests/data/import, synthetic numbers): vLLM
// stdout blocks of old and new versions, --save-result JSON (old and new keys), SGLang stdout and JSONL, GuideLLM
// and AIPerf exports; malformed and truncated inputs fail naming file and line and write nothing; a folder built by
// import alone gives a report with the baseline, the % change and the imported records marked.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "test_paths.h"
#include "importers/importer.h"
#include "report/report.h"
#include "tuner/results_store.h"

namespace servetune::tuner {
namespace {
using namespace servetune::report;     // reports and the check
using namespace servetune::importers;  // other tools' results
namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return testing::data_path("import/" + name); }

std::vector<ImportedResult> parse_fixture(const std::string& name) { return parse_import_file(fixture(name)); }

double metric(const ImportedResult& r, const std::string& key) {
  EXPECT_TRUE(r.metrics.contains(key)) << key << " missing in " << r.metrics.dump();
  return r.metrics.contains(key) ? r.metrics[key].get<double>() : -1.0;
}

// The message of the Error that parsing `name` throws (kFormat), or "" when it does not throw.
std::string parse_error(const std::string& name) {
  try {
    parse_fixture(name);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
    return e.what();
  }
  return "";
}

TEST(TunerImport, VllmOldBlockWithHeadingPreambleAndBlankLines) {
  const auto rs = parse_fixture("vllm_v0_6.txt");
  ASSERT_EQ(rs.size(), 1u);
  const auto& r = rs[0];
  EXPECT_EQ(r.format, "vllm-text");
  EXPECT_EQ(r.line, 8);
  EXPECT_EQ(metric(r, "completed"), 200);
  EXPECT_EQ(metric(r, "duration"), 100.0);
  EXPECT_EQ(metric(r, "total_input_tokens"), 40000);
  EXPECT_EQ(metric(r, "total_output_tokens"), 30000);
  EXPECT_DOUBLE_EQ(metric(r, "request_throughput"), 2.0);
  EXPECT_DOUBLE_EQ(metric(r, "output_throughput"), 300.0);
  EXPECT_DOUBLE_EQ(metric(r, "total_token_throughput"), 700.0);  // "Total Token throughput" (capital T, old vLLM)
  EXPECT_DOUBLE_EQ(metric(r, "mean_ttft_ms"), 120.5);
  EXPECT_DOUBLE_EQ(metric(r, "median_tpot_ms"), 24.8);
  EXPECT_DOUBLE_EQ(metric(r, "p99_itl_ms"), 60.2);
  EXPECT_FALSE(r.metrics.contains("failed"));
  // Printed before the block by vLLM.
  EXPECT_EQ(r.workload["max_concurrency"], 8);
  EXPECT_EQ(r.workload["request_rate"], "inf");
}

TEST(TunerImport, VllmNewBlocksInOneFileWithEveryOptionalRow) {
  const auto rs = parse_fixture("vllm_v0_11_levels.txt");
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].line, 4);
  EXPECT_EQ(rs[0].workload["max_concurrency"], 1);
  EXPECT_EQ(metric(rs[0], "failed"), 0);
  EXPECT_DOUBLE_EQ(metric(rs[0], "max_output_tokens_per_s"), 70.0);
  EXPECT_DOUBLE_EQ(metric(rs[0], "max_concurrent_requests"), 1.0);
  EXPECT_DOUBLE_EQ(metric(rs[0], "p90_ttft_ms"), 75.0);
  EXPECT_DOUBLE_EQ(metric(rs[0], "p50_tpot_ms"), 15.0);
  EXPECT_DOUBLE_EQ(metric(rs[0], "mean_e2el_ms"), 2000.0);
  EXPECT_DOUBLE_EQ(metric(rs[0], "p99_e2el_ms"), 2100.0);
  const auto& b = rs[1];
  EXPECT_EQ(b.workload["max_concurrency"], 16);
  EXPECT_EQ(b.workload["request_rate"], 20);
  EXPECT_DOUBLE_EQ(metric(b, "request_goodput"), 3.5);
  EXPECT_DOUBLE_EQ(metric(b, "p99.9_ttft_ms"), 450.0);
  EXPECT_DOUBLE_EQ(metric(b, "p99.9_itl_ms"), 95.0);
  EXPECT_DOUBLE_EQ(metric(b, "total_token_throughput"), 4608.0);
}

TEST(TunerImport, SpeculativeDecodingSectionAndUnknownRowsGoToSourceExtra) {
  const auto rs = parse_fixture("vllm_specdec.txt");
  ASSERT_EQ(rs.size(), 1u);
  const auto& r = rs[0];
  EXPECT_DOUBLE_EQ(metric(r, "spec_decode_acceptance_rate"), 62.5);
  EXPECT_DOUBLE_EQ(metric(r, "spec_decode_acceptance_length"), 2.88);
  EXPECT_EQ(metric(r, "spec_decode_draft_tokens"), 17100);
  EXPECT_EQ(r.extra["speculative_decoding_per_position_acceptance_pct.position_0"], 80);
  EXPECT_DOUBLE_EQ(r.extra["speculative_decoding_per_position_acceptance_pct.position_2"].get<double>(), 45.5);
}

TEST(TunerImport, VllmJsonOldKeysIncludingGoodputWithColon) {
  const auto rs = parse_fixture("vllm_result_old.json");
  ASSERT_EQ(rs.size(), 1u);
  const auto& r = rs[0];
  EXPECT_EQ(r.format, "vllm-json");
  EXPECT_DOUBLE_EQ(metric(r, "request_goodput"), 9.2);
  EXPECT_DOUBLE_EQ(metric(r, "std_ttft_ms"), 12.5);
  EXPECT_DOUBLE_EQ(metric(r, "total_token_throughput"), 3800.0);
  EXPECT_EQ(r.source["model"], "meta-llama/Meta-Llama-3-8B-Instruct");
  EXPECT_EQ(r.source["date"], "20240812-101500");
  EXPECT_EQ(r.workload["request_rate"], "inf");
  EXPECT_EQ(r.workload["num_prompts"], 500);
  EXPECT_EQ(r.extra["best_of"], 1);  // unknown keys are kept, not dropped
  EXPECT_EQ(r.extra["use_beam_search"], false);
}

TEST(TunerImport, VllmJsonNewKeys) {
  const auto rs = parse_fixture("vllm_result_new.json");
  ASSERT_EQ(rs.size(), 1u);
  const auto& r = rs[0];
  EXPECT_EQ(metric(r, "failed"), 1);
  EXPECT_FALSE(r.metrics.contains("request_goodput"));  // null: no --goodput
  EXPECT_DOUBLE_EQ(metric(r, "max_output_tokens_per_s"), 700.0);
  EXPECT_DOUBLE_EQ(metric(r, "p90_e2el_ms"), 1380.0);
  EXPECT_EQ(r.source["label"], "vllm-tuned");
  EXPECT_EQ(r.source["backend"], "openai-chat");
  EXPECT_EQ(r.workload["dataset"], "random");
  EXPECT_EQ(r.workload["input_len"], 1024);
  EXPECT_EQ(r.workload["max_concurrency"], 32);
  EXPECT_EQ(r.extra["generated_texts"], "(20 per-request values, not imported)");
}

TEST(TunerImport, SglangStdoutBlocks) {
  const auto rs = parse_fixture("sglang_stdout.txt");
  ASSERT_EQ(rs.size(), 1u);
  const auto& r = rs[0];
  EXPECT_EQ(r.format, "sglang-text");
  EXPECT_EQ(r.source["backend"], "sglang");
  EXPECT_EQ(r.workload["request_rate"], "inf");
  EXPECT_TRUE(r.workload["max_concurrency"].is_null());  // "not set"
  EXPECT_DOUBLE_EQ(metric(r, "mean_e2el_ms"), 30050.0);
  EXPECT_DOUBLE_EQ(metric(r, "p90_e2el_ms"), 36000.0);
  EXPECT_DOUBLE_EQ(metric(r, "max_itl_ms"), 900.0);
  EXPECT_DOUBLE_EQ(metric(r, "p95_itl_ms"), 150.0);
  EXPECT_DOUBLE_EQ(metric(r, "total_token_throughput"), 3840.0);
  EXPECT_DOUBLE_EQ(metric(r, "spec_decode_acceptance_length"), 3.1);
  EXPECT_DOUBLE_EQ(r.extra["concurrency"].get<double>(), 150.25);
  EXPECT_EQ(r.extra["total_generated_tokens_retokenized"], 51180);
  EXPECT_EQ(r.extra["input_token_throughput_tok_s"], 2560);

  const auto old = parse_fixture("sglang_stdout_old.txt");
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0].format, "sglang-text");
  EXPECT_DOUBLE_EQ(metric(old[0], "total_token_throughput"), 1000.0);  // "Total throughput (tok/s)"
  EXPECT_EQ(old[0].workload["request_rate"], 2);
}

TEST(TunerImport, SglangJsonLines) {
  const auto rs = parse_fixture("sglang.jsonl");
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].format, "sglang-json");
  EXPECT_EQ(rs[0].line, 1);
  EXPECT_EQ(rs[1].line, 2);
  EXPECT_EQ(rs[1].workload["request_rate"], 8.0);
  EXPECT_DOUBLE_EQ(metric(rs[0], "total_token_throughput"), 5120.0);
  EXPECT_DOUBLE_EQ(metric(rs[0], "mean_e2el_ms"), 5004.0);
  EXPECT_DOUBLE_EQ(metric(rs[1], "p95_itl_ms"), 30.0);
  EXPECT_DOUBLE_EQ(rs[0].extra["input_throughput"].get<double>(), 4096.0);
}

TEST(TunerImport, GuidellmExport) {
  const auto rs = parse_fixture("guidellm.json");
  ASSERT_EQ(rs.size(), 2u);
  const auto& r = rs[0];
  EXPECT_EQ(r.format, "guidellm-json");
  EXPECT_EQ(r.locator, "benchmarks[0]");
  EXPECT_EQ(metric(r, "completed"), 64);
  EXPECT_DOUBLE_EQ(metric(r, "request_throughput"), 64 / 32.0);  // completed / duration, vLLM's definition
  EXPECT_DOUBLE_EQ(metric(r, "output_throughput"), 64 * 64 / 32.0);
  EXPECT_DOUBLE_EQ(metric(r, "total_token_throughput"), 64 * 320 / 32.0);
  EXPECT_DOUBLE_EQ(metric(r, "mean_ttft_ms"), 40.0);
  EXPECT_DOUBLE_EQ(metric(r, "mean_tpot_ms"), 12.0);               // inter_token_latency_ms
  EXPECT_DOUBLE_EQ(metric(r, "mean_e2el_ms"), (2.0 + 0.4) * 1000);  // request_latency is in seconds
  EXPECT_TRUE(r.metrics.contains("p99.9_ttft_ms"));                // "p999"
  EXPECT_TRUE(r.metrics.contains("p0.1_ttft_ms"));                 // "p001"
  EXPECT_EQ(r.workload["max_concurrency"], 4);
  EXPECT_EQ(rs[1].workload["max_concurrency"], 16);
  EXPECT_DOUBLE_EQ(r.extra["mean_time_per_output_token_ms"].get<double>(), 12.0 * 1.1);
  EXPECT_EQ(r.source["tool_version"], "0.8.1");
}

TEST(TunerImport, AiperfExport) {
  const auto rs = parse_fixture("aiperf.json");
  ASSERT_EQ(rs.size(), 1u);
  const auto& r = rs[0];
  EXPECT_EQ(r.format, "aiperf-json");
  EXPECT_EQ(metric(r, "completed"), 200);
  EXPECT_DOUBLE_EQ(metric(r, "request_throughput"), 13.0);
  EXPECT_DOUBLE_EQ(metric(r, "output_throughput"), 1259.0);
  EXPECT_DOUBLE_EQ(metric(r, "total_token_throughput"), (110000.0 + 19370.0) / 15.4);
  EXPECT_DOUBLE_EQ(metric(r, "mean_ttft_ms"), 1590.0);
  EXPECT_DOUBLE_EQ(metric(r, "median_tpot_ms"), 52.0);
  EXPECT_DOUBLE_EQ(metric(r, "p99_e2el_ms"), 9400.0);
  EXPECT_EQ(r.workload["max_concurrency"], 100);
  EXPECT_EQ(r.source["model"], "openai/gpt-oss-20b");
  EXPECT_TRUE(r.extra.contains("time_to_second_token"));
  EXPECT_TRUE(r.extra.contains("output_token_throughput_per_user"));
}

TEST(TunerImport, MalformedAndTruncatedInputNameFileAndLine) {
  std::string e = parse_error("bad_truncated_block.txt");
  EXPECT_NE(e.find("bad_truncated_block.txt:15:"), std::string::npos) << e;
  EXPECT_NE(e.find("starts at line 1"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  e = parse_error("bad_value.txt");
  EXPECT_NE(e.find("bad_value.txt:14:"), std::string::npos) << e;
  EXPECT_NE(e.find("'abc'"), std::string::npos) << e;
  e = parse_error("bad_row.txt");
  EXPECT_NE(e.find("bad_row.txt:19:"), std::string::npos) << e;
  e = parse_error("bad_missing_row.txt");
  EXPECT_NE(e.find("bad_missing_row.txt:8:"), std::string::npos) << e;
  EXPECT_NE(e.find("output_throughput"), std::string::npos) << e;
  e = parse_error("bad_second_header.txt");
  EXPECT_NE(e.find("bad_second_header.txt:14:"), std::string::npos) << e;
  e = parse_error("bad_second_truncated.txt");
  EXPECT_NE(e.find("bad_second_truncated.txt:36:"), std::string::npos) << e;
  e = parse_error("bad_truncated.json");
  EXPECT_NE(e.find("bad_truncated.json:101:"), std::string::npos) << e;
  e = parse_error("bad_truncated.jsonl");
  EXPECT_NE(e.find("bad_truncated.jsonl:2:"), std::string::npos) << e;
  e = parse_error("not_a_result.txt");
  EXPECT_NE(e.find("no benchmark result found"), std::string::npos) << e;
  EXPECT_NE(parse_error("../stories260K.gguf"), "");
  try {
    parse_import_text("inline.json", R"({"completed": 3, "request_throughput": "fast", "output_throughput": 1})");
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("'request_throughput' is \"fast\", not a number"), std::string::npos) << err.what();
  }
  EXPECT_THROW(parse_import_text("x.json", R"({"hello": 1})"), Error);
  EXPECT_THROW(parse_import_text("x.txt", ""), Error);
}

// Every prefix of every valid example (a copy cut short anywhere) and a few type mutations either parse or fail
// with servetune's Error naming the file; nothing else escapes.
TEST(TunerImport, AnyTruncationOrMutationIsACleanErrorOrAResult) {
  for (const char* name : {"vllm_v0_6.txt", "vllm_v0_11_levels.txt", "vllm_specdec.txt", "vllm_result_old.json", "vllm_result_new.json",
                           "sglang_stdout.txt", "sglang.jsonl", "guidellm.json", "aiperf.json"}) {
    const std::string text = read_text_file(fixture(name));
    std::vector<std::string> inputs;
    const size_t step = std::max<size_t>(1, text.size() / 400);
    for (size_t n = 0; n < text.size(); n += step) inputs.push_back(text.substr(0, n));
    for (const char* from : {"1", "2", "0", "\"successful\"", "\"avg\""}) {
      std::string mutated = text;
      for (size_t at = mutated.find(from); at != std::string::npos; at = mutated.find(from, at + 8)) {
        mutated.replace(at, std::string(from).size(), std::string(from)[0] == '"' ? "\"x\"" : "\"s\"");
        inputs.push_back(mutated);
        if (inputs.size() % 50 == 0) break;
      }
    }
    for (const auto& in : inputs) {
      try {
        const auto rs = parse_import_text(name, in);
        EXPECT_FALSE(rs.empty());
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << ": " << e.what() << "\ninput:\n" << in.substr(0, 300);
        return;
      }
    }
  }
}

class TunerImportDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("servetune_import_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  ImportOptions opts(std::vector<std::string> files) {
    ImportOptions o;
    for (auto& f : files) o.files.push_back(fixture(f));
    o.into = (dir_ / "run").string();
    return o;
  }
  fs::path dir_;
};

TEST_F(TunerImportDir, WritesRecordsWithCandidateWorkloadAndProvenance) {
  ImportOptions o = opts({"vllm_v0_6.txt"});
  o.sets = {"engine=vllm", "version=0.11.0", "tp_size=8", "enable_dp_attention=false"};
  o.workloads = {"chat"};
  const ImportOutcome out = run_import(o);
  ASSERT_EQ(out.records.size(), 1u);
  const auto recs = load_records(o.into);
  ASSERT_EQ(recs.size(), 1u);
  const auto& r = recs[0];
  EXPECT_EQ(r["schema"], kRecordSchema);
  EXPECT_EQ(r["candidate"]["id"], "vllm-0.11.0-tp_size8-enable_dp_attentionfalse");
  EXPECT_EQ(r["candidate"]["settings"]["tp_size"], 8);
  EXPECT_EQ(r["candidate"]["settings"]["engine"], "vllm");
  EXPECT_EQ(r["candidate"]["settings"]["enable_dp_attention"], false);
  EXPECT_EQ(r["candidate"]["engine_version"], "0.11.0");
  EXPECT_EQ(r["workload"]["name"], "chat");
  EXPECT_EQ(r["workload"]["max_concurrency"], 8);
  EXPECT_EQ(r["provenance"]["source"], "imported");
  EXPECT_EQ(r["provenance"]["format"], "vllm-text");
  EXPECT_EQ(r["provenance"]["file"], "vllm_v0_6.txt");
  EXPECT_EQ(r["provenance"]["line"], 8);
  EXPECT_EQ(r["metrics"]["total_token_throughput"], 700.0);
  EXPECT_EQ(read_import_manifest(o.into).baseline, "vllm-0.11.0-tp_size8-enable_dp_attentionfalse");
  EXPECT_EQ(read_import_manifest(o.into).workloads, std::vector<std::string>{"chat"});
  // Importing the same block again replaces it (no duplicate repeat) ...
  EXPECT_NO_THROW(run_import(o));
  EXPECT_EQ(load_records(o.into).size(), 1u);
  // ... but a different result under the same names is refused.
  ImportOptions other = opts({"sglang_stdout_old.txt"});
  other.sets = o.sets;
  other.workloads = {"chat"};
  EXPECT_THROW(run_import(other), Error);
}

TEST_F(TunerImportDir, ConcurrencyLevelsBecomeAWorkloadGroup) {
  ImportOptions o = opts({"vllm_v0_11_levels.txt"});
  o.candidate = "vllm";
  o.workloads = {"load"};
  run_import(o);
  const ReportData d = load_report(o.into);
  EXPECT_EQ(d.table.group("load"), (std::vector<std::string>{"load@c1", "load@c16"}));
}

TEST_F(TunerImportDir, CandidateFromFileNameOrLabel) {
  run_import(opts({"sglang.jsonl", "vllm_result_new.json"}));
  const auto recs = load_records((dir_ / "run").string());
  ASSERT_EQ(recs.size(), 3u);
  std::set<std::string> names;
  for (const auto& r : recs) names.insert(r["candidate"]["id"].get<std::string>() + "/" + r["workload"]["name"].get<std::string>());
  EXPECT_EQ(names, (std::set<std::string>{"sglang/random@r4", "sglang/random@r8", "vllm-tuned/random"}));
}

TEST_F(TunerImportDir, NothingIsWrittenWhenAnyFileIsBad) {
  ImportOptions o = opts({"vllm_v0_6.txt", "sglang.jsonl", "bad_second_truncated.txt"});
  EXPECT_THROW(run_import(o), Error);
  EXPECT_FALSE(fs::exists(o.into));
  ImportOptions w = opts({"vllm_v0_11_levels.txt"});
  w.workloads = {"a", "b", "c"};  // 3 names for 2 results
  try {
    run_import(w);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
  }
  ImportOptions s = opts({"vllm_v0_6.txt"});
  s.sets = {"no_equals_sign"};
  EXPECT_THROW(run_import(s), Error);
  EXPECT_FALSE(fs::exists(o.into));
}

TEST_F(TunerImportDir, ReportComparesImportedBaselineAndTuned) {
  const std::vector<std::string> workloads = {"chat", "long_input", "long_output", "latency", "throughput"};
  ImportOptions base = opts({"study/baseline_vllm.txt"});
  base.sets = {"engine=vllm", "version=0.11.0"};
  base.candidate = "vllm-baseline";
  base.workloads = workloads;
  run_import(base);
  ImportOptions tuned = opts({"study/tuned_sglang.txt"});
  tuned.sets = {"engine=sglang", "version=0.5.4", "enable_dp_attention=true"};
  tuned.candidate = "sglang-tuned";
  tuned.workloads = workloads;
  run_import(tuned);
  const ReportData d = load_report(base.into);
  EXPECT_EQ(d.baseline, "vllm-baseline");  // the first imported, though "sglang-tuned" sorts first
  EXPECT_EQ(d.best, "sglang-tuned");
  EXPECT_EQ(d.table.workloads(), workloads);
  EXPECT_EQ(d.imports.size(), 10u);
  const std::string md = render_markdown(d);
  EXPECT_NE(md.find("**Best: `sglang-tuned`** (imported)"), std::string::npos) << md;
  // chat: 250000 + 200000 tokens in 50 s = 9000 tok/s, tuned 20% faster; TPOT 20 ms -> 17 ms.
  EXPECT_NE(md.find("| chat | 9000 | 10800 | +20.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 20 | 17 | -15.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| throughput |"), std::string::npos) << md;
  EXPECT_NE(md.find("## Imported results"), std::string::npos) << md;
  EXPECT_NE(md.find("baseline_vllm.txt:"), std::string::npos) << md;
  const std::string html = render_html(d);
  EXPECT_NE(html.find("sglang-tuned*"), std::string::npos);
}

}  // namespace
}  // namespace servetune::tuner
