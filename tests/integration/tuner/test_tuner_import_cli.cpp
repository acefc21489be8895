// `servetune import` then `servetune report` through the binary: a run folder built only from imported blocks (a
// vLLM baseline and a tuned SGLang engine across five workloads, tests/data/import/study) gives a report whose
// baseline-vs-best table shows each workload's throughput and TPOT with the % change; bad input exits non-zero,
// names file and line, and creates nothing.
#include "test_paths.h"
#include "tuner_cli.h"

namespace servetune::testing {
namespace {
namespace fs = std::filesystem;

const char* kWorkloads = "--workload chat --workload long_input --workload long_output --workload latency --workload throughput";

std::string study(const std::string& name) { return data_path("import/study/" + name); }

TEST(TunerImportCli, ReportFromImportedBlocksOnly) {
  const fs::path dir = scratch("import");
  const std::string run = (dir / "nested" / "run").string();  // does not exist yet
  CliResult r = servetune("import " + study("baseline_vllm.txt") + " --into " + run +
                          " --candidate vllm-baseline --set engine=vllm --set version=0.11.0 --set tp_size=8 " + kWorkloads);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("imported vllm-baseline / chat (repeat 0): 9000 tok/s total, mean TPOT 20 ms"), std::string::npos) << r.output;
  r = servetune("import " + study("tuned_sglang.txt") + " --into " + run +
                " --candidate sglang-tuned --set engine=sglang --set version=0.5.4 --set tp_size=8 --set enable_dp_attention=true " +
                kWorkloads);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count_files(fs::path(run) / "records"), 10u);

  r = servetune("report " + run);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string& md = r.output;
  EXPECT_NE(md.find("Baseline `vllm-baseline` (imported)"), std::string::npos) << md;
  EXPECT_NE(md.find("best `sglang-tuned` (imported)"), std::string::npos) << md;
  // Throughput and TPOT side by side with the % change, for each of the five workloads.
  for (const char* row : {"| chat | 9000 | 10800 | +20.0% |", "| long_input | 27200 | 29920 | +10.0% |",
                          "| long_output | 7253 | 9792 | +35.0% |", "| latency | 96 | 91.2 | -5.0% |",
                          "| throughput | 25600 | 38400 | +50.0% |"}) {
    EXPECT_NE(md.find(row), std::string::npos) << row << "\n" << md;
  }
  EXPECT_NE(md.find("| 20 | 17 | -15.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("## Imported results"), std::string::npos) << md;
  EXPECT_NE(md.find("tuned_sglang.txt:4"), std::string::npos) << md;

  const std::string html = (dir / "report.html").string();
  r = servetune("report " + run + " --format html --output " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string page = read_text(html);
  EXPECT_NE(page.find("<svg"), std::string::npos);
  EXPECT_NE(page.find("sglang-tuned*"), std::string::npos);
  r = servetune("report " + run + " --format csv");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("feasible,source\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sglang-tuned,sglang-tuned,ok,,,"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(",yes,imported\n"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(TunerImportCli, BadInputNamesTheLineAndWritesNothing) {
  const fs::path dir = scratch("import_bad");
  const std::string run = (dir / "run").string();
  CliResult r = servetune("import " + study("baseline_vllm.txt") + " " + data_path("import/bad_value.txt") + " --into " + run);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("bad_value.txt:14:"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run));
  r = servetune("import " + study("baseline_vllm.txt") + " --into " + run + " --set tp_size");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_FALSE(fs::exists(run));
  r = servetune("import " + study("baseline_vllm.txt") + " --into " + run + " --dry-run");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("would import baseline_vllm / imported@c64"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace servetune::testing
