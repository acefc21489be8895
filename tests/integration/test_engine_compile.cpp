// The `compile` setting on the CPU: `fused` (stacked QKV and gate/up matmuls, rotary fused with the KV store, residual
// adds fused into RMSNorm) gives greedy output identical to `eager` on stories260K, SmolLM2 (Q4_1) and a random
// qwen2-style model with q/k/v biases, under tensor parallelism too; `graphs` is a clear error on the CPU (its
// decode-graph logic is tested on the CPU in unit/test_device_style_loading.cpp), as is cuda_graph_max_bs without it;
// device cuda / hip in a build without them names the preset to build.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "backend/backend.h"
#include "core/error.h"
#include "integration/greedy_jobs.h"
#include "model/make_model.h"
#include "servetune/engine.h"
#include "test_paths.h"

namespace servetune {
namespace {

std::vector<std::vector<int32_t>> run_compiled(const std::string& model, const std::string& compile, int tp,
                                               std::vector<testing::Job>& jobs) {
  EngineConfig c;
  c.model = model;
  c.compile = parse_compile_level(compile);
  c.threads = 2;
  c.tp_size = tp;
  c.max_total_tokens = 16384;
  Engine engine(c);
  if (jobs.empty()) jobs = testing::mixed_jobs(engine.tokenizer(), 8, 24);
  return testing::run_greedy(engine, jobs, true);
}

void expect_fused_equals_eager(const std::string& model, int tp) {
  std::vector<testing::Job> jobs;
  const auto eager = run_compiled(model, "eager", 1, jobs);
  const auto fused = run_compiled(model, "fused", tp, jobs);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(fused[i], eager[i]) << model << " tp " << tp << ": request " << i;
}

TEST(EngineCompile, FusedGreedyIdenticalToEagerOnStories260K) { expect_fused_equals_eager(testing::stories_path(), 1); }

TEST(EngineCompile, FusedGreedyIdenticalToEagerOnSmolLM2) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  expect_fused_equals_eager(testing::smollm2_path(), 1);
}

TEST(EngineCompile, FusedWithQkvBiasesAndTensorParallelIdenticalToEager) {
  const auto dir = std::filesystem::temp_directory_path() / ("servetune_compile_qwen2_" + std::to_string(::getpid()));
  HfModelConfig config = model_preset("tiny-gqa");
  config.model_type = "qwen2";
  config.architecture = "Qwen2ForCausalLM";
  config.attention_bias = true;
  write_random_model(config, dir.string(), 11, DType::kF32, 0.05f);
  expect_fused_equals_eager(dir.string(), 1);
  expect_fused_equals_eager(dir.string(), 2);
  std::filesystem::remove_all(dir);
}

TEST(EngineCompile, GraphsOnCpuAndGraphSizesWithoutGraphsAreClearErrors) {
  EngineConfig c;
  c.model = testing::stories_path();
  c.compile = CompileLevel::kGraphs;
  try {
    c.validate();
    FAIL() << "compile = graphs was accepted on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a GPU device"), std::string::npos) << e.what();
  }
  c.compile = CompileLevel::kFused;
  c.cuda_graph_max_bs = 32;
  try {
    c.validate();
    FAIL() << "cuda_graph_max_bs was accepted with compile = fused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("compile = graphs"), std::string::npos) << e.what();
  }
}

TEST(EngineCompile, GpuDevicesNeedTheirBuild) {
  EngineConfig c;
  c.model = testing::stories_path();
  for (const std::string device : {"cuda", "hip"}) {
    c.device = parse_device(device);
    if (backend_available(device)) {
      EXPECT_NO_THROW(c.validate()) << device;
      c.tp_size = 2;
      EXPECT_THROW(c.validate(), Error) << "tensor parallelism on " << device << " is not implemented yet";
      c.tp_size = 1;
      c.kv_cache_dtype = KvCacheDtype::kFp8E4m3;
      try {
        c.validate();
        ADD_FAILURE() << "kv_cache_dtype fp8_e4m3 accepted on " << device << ", whose kernels read f32 and f16 only";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
        EXPECT_NE(std::string(e.what()).find("cpu only"), std::string::npos) << e.what();
      }
      c.kv_cache_dtype = KvCacheDtype::kAuto;
      continue;
    }
    try {
      c.validate();
      FAIL() << "device " << device << " accepted by a build without it";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("cmake --preset " + device), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_device("tpu"), Error);  // not a device word: rejected where the text is read
}

}  // namespace
}  // namespace servetune
