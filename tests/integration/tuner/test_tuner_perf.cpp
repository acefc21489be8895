// The CI regression check on the built-in engine (SmolLM2): an unchanged build passes, an injected slowdown (the
// scalar reference kernels, SERVETUNE_CPU_ISA=reference: the regression of a SIMD dispatch that stopped working)
// fails with exit code 1 naming the metric; the committed CI baseline belongs to configs/ci-perf.yaml.
#include "test_paths.h"
#include "tuner/sweep_spec.h"
#include "tuner_cli.h"

namespace servetune::testing {
namespace {
namespace fs = std::filesystem;

std::string tiny_sweep(int repeat) {
  return "name: slowdown\ntarget:\n  engine: builtin\n  model: " + smollm2_path() +
         "\n  settings: {threads: 2, max_total_tokens: 1024}\n"
         "workloads:\n  - {name: tiny, dataset: random, input_len: 24, output_len: 8, num_prompts: 4, seed: 3}\n"
         "repeat: " + std::to_string(repeat) + "\n"
         "check:\n  tolerances: [completed=0, failed=+0, total_input_tokens=0, total_output_tokens=0, "
         "engine_generation_tokens=0, calibrated_cpu_per_token=+150%]\n";
}

TEST(TunerPerfCheck, PassesUnchangedAndFailsOnAnInjectedSlowdown) {
  SERVETUNE_REQUIRE_FILE(smollm2_path());
  const fs::path dir = scratch("perf");
  write_text(dir / "s.yaml", tiny_sweep(3));
  write_text(dir / "slow.yaml", tiny_sweep(1));
  ASSERT_EQ(servetune("sweep " + (dir / "s.yaml").string() + " --output " + (dir / "base").string()).code, 0);
  ASSERT_EQ(servetune("sweep " + (dir / "s.yaml").string() + " --output " + (dir / "same").string()).code, 0);
  const CliResult same = servetune("check --baseline " + (dir / "base").string() + " --current " + (dir / "same").string());
  EXPECT_EQ(same.code, 0) << same.output;
  EXPECT_NE(same.output.find("all 6 comparisons within tolerance"), std::string::npos) << same.output;

  const CliResult slow_run = servetune("sweep " + (dir / "slow.yaml").string() + " --output " + (dir / "slow").string(),
                                       "SERVETUNE_CPU_ISA=reference");
  ASSERT_EQ(slow_run.code, 0) << slow_run.output;
  const CliResult slow = servetune("check --baseline " + (dir / "base").string() + " --current " + (dir / "slow").string());
  EXPECT_EQ(slow.code, 1) << slow.output;
  const size_t row = slow.output.find("calibrated_cpu_per_token");
  ASSERT_NE(row, std::string::npos) << slow.output;
  EXPECT_NE(slow.output.find("REGRESSION", row), std::string::npos) << slow.output;
  EXPECT_NE(slow.output.find("total_output_tokens"), std::string::npos);
  const auto base_record = read_json(dir / "base" / "records" / "c0" / "tiny.r0.json");
  if (base_record["provenance"]["environment"]["engine_cpu_isa"] != "reference") {  // a SIMD host: the ISAs differ
    EXPECT_NE(slow.output.find("warning: the baseline ran the built-in engine's CPU kernels at ISA"), std::string::npos)
        << slow.output;
  }
  fs::remove_all(dir);
}

// One baseline per CPU ISA class the CI may run on (scripts/perf_check.sh picks the host's).
TEST(TunerPerfCheck, CommittedBaselinesMatchTheCiConfig) {
  const auto config = nlohmann::json::parse(tuner::load_sweep(source_path("configs/ci-perf.yaml")).document.dump());
  for (const char* isa : {"avx2", "avx512"}) {
    SCOPED_TRACE(isa);
    const fs::path base = source_path(std::string("results/ci-perf/baseline-") + isa);
    ASSERT_TRUE(fs::exists(base / "sweep.json"))
        << "commit a baseline: scripts/perf_check.sh --update-baseline on a machine of this ISA class";
    // What is measured must match; the check's tolerances and the description may change without a new baseline.
    const auto stored = read_json(base / "sweep.json")["document"];
    for (const char* key : {"target", "space", "workloads", "repeat", "strategy"}) {
      EXPECT_EQ(stored.value(key, nlohmann::json()).dump(), config.value(key, nlohmann::json()).dump())
          << "configs/ci-perf.yaml's " << key << " changed since the baseline was recorded; "
          << "record a new one with scripts/perf_check.sh --update-baseline";
    }
    EXPECT_GE(count_files(base / "records"), 3u);
  }
}

}  // namespace
}  // namespace servetune::testing
