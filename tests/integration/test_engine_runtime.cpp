// The serving runtime end to end on real models: batching, prefix caching, chunked prefill and preemption never
// change a greedy output; bad requests get clear errors while the engine keeps serving; aborts free the KV cache.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "servetune/engine.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

struct Job {
  std::vector<int32_t> prompt;
  int max_tokens;
};

std::vector<int32_t> run_one(Engine& engine, const Job& job) {
  Request r;
  r.prompt_ids = job.prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = job.max_tokens;
  auto stream = engine.submit(r);
  std::vector<int32_t> out;
  while (auto e = stream->next()) {
    out.insert(out.end(), e->token_ids.begin(), e->token_ids.end());
    if (e->finish != FinishReason::kNone) {
      EXPECT_NE(e->finish, FinishReason::kError) << e->error;
      break;
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> run_all(Engine& engine, const std::vector<Job>& jobs) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& job : jobs) {
    Request r;
    r.prompt_ids = job.prompt;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = job.max_tokens;
    streams.push_back(engine.submit(r));
  }
  std::vector<std::vector<int32_t>> outs;
  for (auto& s : streams) {
    std::vector<int32_t> out;
    EngineClock::time_point last{};
    while (auto e = s->next()) {
      EXPECT_GE(e->time, last);  // engine timestamps are monotonic within a stream
      last = e->time;
      out.insert(out.end(), e->token_ids.begin(), e->token_ids.end());
      if (e->finish != FinishReason::kNone) {
        EXPECT_NE(e->finish, FinishReason::kError) << e->error;
        break;
      }
    }
    outs.push_back(out);
  }
  return outs;
}

// 64 requests of mixed lengths; several share long prefixes so the prefix cache has work to do.
std::vector<Job> mixed_jobs(const Tokenizer& tok) {
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily.", "The cat sat on the mat.",
      "Tom and Sue went to the park to play with a big red ball. They ran and laughed all day long.",
      "def add(a, b):\n    return a + b\n", "One day, a bird flew into the garden and sang a song.", "Hi"};
  std::vector<Job> jobs;
  for (int i = 0; i < 64; ++i) {
    std::string text;
    for (int k = 0; k <= i % 7; ++k) text += texts[static_cast<size_t>((i + k) % texts.size())] + " ";
    if (i % 3 == 0) text = texts[2] + texts[2] + text;  // a long shared prefix
    jobs.push_back({tok.encode(text), 1 + (i * 7) % 40});
  }
  return jobs;
}

EngineConfig base_config(const std::string& model, const std::string& kv_cache_dtype = "auto") {
  EngineConfig c;
  c.model = model;
  c.kv_cache_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  c.threads = 2;
  c.max_total_tokens = 32768;
  return c;
}

// max_prompt > 0 cuts every prompt to that many tokens (the tiny HF models' 256-token context).
void check_model(const std::string& model, const std::string& kv = "auto", size_t max_prompt = 0) {
  SERVETUNE_REQUIRE_FILE(model);
  std::vector<Job> jobs;
  std::vector<std::vector<int32_t>> alone;
  {
    EngineConfig c = base_config(model, kv);
    c.disable_radix_cache = true;
    Engine engine(c);
    jobs = mixed_jobs(engine.tokenizer());
    for (Job& j : jobs) {
      if (max_prompt > 0 && j.prompt.size() > max_prompt) j.prompt.resize(max_prompt);
    }
    for (const auto& j : jobs) alone.push_back(run_one(engine, j));
  }
  struct Variant {
    const char* name;
    EngineConfig config;
  };
  std::vector<Variant> variants;
  variants.push_back({"batched, prefix cache on, chunked prefill", base_config(model, kv)});
  variants.back().config.chunked_prefill_size = 64;
  variants.back().config.max_prefill_tokens = 256;
  variants.push_back({"batched, prefix cache off, no chunking", base_config(model, kv)});
  variants.back().config.disable_radix_cache = true;
  variants.back().config.chunked_prefill_size = -1;
  variants.push_back({"tiny KV cache (forces preemption), lpm", base_config(model, kv)});
  variants.back().config.max_total_tokens = 512;
  variants.back().config.page_size = 8;
  variants.back().config.schedule_policy = SchedulePolicy::kLpm;
  for (auto& v : variants) {
    Engine engine(v.config);
    auto outs = run_all(engine, jobs);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i], alone[i]) << v.name << ": request " << i;
    // The prefix cache sees the shared prefixes on a second pass of the same requests.
    auto again = run_all(engine, jobs);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(again[i], alone[i]) << v.name << " (second pass): request " << i;
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.running, 0);
    EXPECT_EQ(s.kv_blocks_used, 0) << v.name;
    if (!v.config.disable_radix_cache) {
      EXPECT_GT(s.prefix_cache_hit_rate(), 0.0) << v.name;
    }
    if (v.config.max_total_tokens == 512) {
      EXPECT_GT(s.preemptions, 0) << v.name;
    }
  }
}

TEST(EngineRuntime, Stories260KOutputsIndependentOfScheduling) { check_model(testing::stories_path()); }
TEST(EngineRuntime, SmolLM2OutputsIndependentOfScheduling) { check_model(testing::smollm2_path()); }
TEST(EngineRuntime, Stories260KF16KvOutputsIndependentOfScheduling) { check_model(testing::stories_path(), "f16"); }
TEST(EngineRuntime, Stories260KFp8KvOutputsIndependentOfScheduling) { check_model(testing::stories_path(), "fp8_e4m3"); }
TEST(EngineRuntime, SmolLM2Fp8KvOutputsIndependentOfScheduling) { check_model(testing::smollm2_path(), "fp8_e4m3"); }
// The mixture-of-experts families: experts grouped per batch and, for DeepSeek, the latent cache.
TEST(EngineRuntime, DeepSeekV3TinyOutputsIndependentOfScheduling) {
  check_model(testing::data_path("hf_models/deepseek_v3_tiny"), "auto", 150);
}
TEST(EngineRuntime, DeepSeekV3TinyFp8KvOutputsIndependentOfScheduling) {
  check_model(testing::data_path("hf_models/deepseek_v3_tiny"), "fp8_e4m3", 150);
}
TEST(EngineRuntime, DeepSeekV2LiteTinyOutputsIndependentOfScheduling) {
  check_model(testing::data_path("hf_models/deepseek_v2_lite_tiny"), "f16", 150);
}
TEST(EngineRuntime, Qwen3MoeTinyOutputsIndependentOfScheduling) {
  check_model(testing::data_path("hf_models/qwen3_moe_tiny"), "auto", 150);
}
TEST(EngineRuntime, MixtralTinyOutputsIndependentOfScheduling) {
  check_model(testing::data_path("hf_models/mixtral_tiny"), "auto", 150);
}

ErrorKind submit_error(Engine& engine, Request r) {
  try {
    engine.submit(std::move(r));
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kInternal;
}

TEST(EngineRuntime, BadRequestsAreRejectedAndOthersKeepRunning) {
  EngineConfig c = base_config(testing::stories_path());
  Engine engine(c);
  Request ok;
  ok.prompt = "Once upon a time";
  ok.sampling.temperature = 0.0f;
  ok.sampling.max_tokens = 200;
  auto running = engine.submit(ok);

  Request zero = ok;
  zero.sampling.max_tokens = 0;
  EXPECT_EQ(submit_error(engine, zero), ErrorKind::kInvalidRequest);
  Request empty = ok;
  empty.prompt = "";
  empty.add_special_tokens = false;
  EXPECT_EQ(submit_error(engine, empty), ErrorKind::kInvalidRequest);
  Request too_long = ok;
  too_long.prompt.clear();
  too_long.prompt_ids.assign(2040, 300);
  too_long.sampling.max_tokens = 100;  // 2040 + 100 > context 2048
  EXPECT_EQ(submit_error(engine, too_long), ErrorKind::kInvalidRequest);
  Request bad_id = ok;
  bad_id.prompt.clear();
  bad_id.prompt_ids = {1, 100000};
  EXPECT_EQ(submit_error(engine, bad_id), ErrorKind::kInvalidRequest);
  EXPECT_FALSE(engine.abort(987654));

  std::vector<int32_t> ids;
  FinishReason finish = FinishReason::kNone;
  while (auto e = running->next()) {
    ids.insert(ids.end(), e->token_ids.begin(), e->token_ids.end());
    if (e->finish != FinishReason::kNone) {
      finish = e->finish;
      break;
    }
  }
  EXPECT_NE(finish, FinishReason::kError);
  EXPECT_FALSE(ids.empty());

  engine.shutdown();
  EXPECT_EQ(submit_error(engine, ok), ErrorKind::kUsage);
}

TEST(EngineRuntime, AbortEndsTheStreamAndFreesBlocks) {
  Engine engine(base_config(testing::stories_path()));
  Request r;
  r.prompt = "Once upon a time";
  r.sampling.max_tokens = 1500;
  r.sampling.ignore_eos = true;
  auto stream = engine.submit(r);
  auto first = stream->next();
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(engine.abort(stream->id()));
  FinishReason finish = first->finish;
  while (finish == FinishReason::kNone) {
    auto e = stream->next();
    ASSERT_TRUE(e.has_value());
    finish = e->finish;
  }
  EXPECT_EQ(finish, FinishReason::kAbort);
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.requests_aborted, 1);
}

// flush_prefix_cache: a repeated prompt hits the cache, and after a flush it is computed again.
TEST(EngineRuntime, FlushPrefixCacheMakesTheNextRequestCold) {
  Engine engine(base_config(testing::stories_path()));
  const auto prompt = engine.tokenizer().encode("Once upon a time, there was a little girl named Lily. She liked to play", true);
  const auto cached = [&] {
    Request r;
    r.prompt_ids = prompt;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 2;
    auto stream = engine.submit(r);
    int64_t tokens = -1;
    while (auto e = stream->next()) {
      if (e->finish != FinishReason::kNone) {
        tokens = e->usage.cached_tokens;
        break;
      }
    }
    return tokens;
  };
  EXPECT_EQ(cached(), 0);
  EXPECT_GT(cached(), 0);
  EXPECT_GT(engine.flush_prefix_cache(), 0);
  EXPECT_EQ(cached(), 0);
  engine.shutdown();
  EXPECT_EQ(engine.flush_prefix_cache(), 0);  // after shutdown: nothing to flush, no hang
}

TEST(EngineRuntime, FreshEngineReportsItsKvCapacity) {
  // Before any request has run a step: /metrics and the server's startup line read these.
  EngineConfig c = base_config(testing::stories_path());
  c.max_total_tokens = 1000;
  c.page_size = 16;
  Engine engine(c);
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.kv_blocks_total, 63);  // ceil(1000 / 16)
  EXPECT_EQ(s.kv_blocks_free, 63);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.page_size, 16);
  EXPECT_EQ(s.steps, 0);
}

TEST(EngineRuntime, LongPromptAloneInSmallChunks) {
  // Steps that only advance a prefill produce no logits; the chunked result equals the unchunked one.
  EngineConfig c = base_config(testing::stories_path());
  std::vector<int32_t> chunked, whole;
  {
    c.chunked_prefill_size = 8;
    Engine engine(c);
    chunked = run_one(engine, {engine.tokenizer().encode("Once upon a time there was a little girl named Lily who"), 8});
  }
  {
    c.chunked_prefill_size = -1;
    Engine engine(c);
    whole = run_one(engine, {engine.tokenizer().encode("Once upon a time there was a little girl named Lily who"), 8});
  }
  EXPECT_EQ(chunked.size(), 8u);
  EXPECT_EQ(chunked, whole);
}

TEST(EngineRuntime, StopStringsAndSeeds) {
  Engine engine(base_config(testing::stories_path()));
  Request r;
  r.prompt = "Once upon a time";
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 40;
  r.sampling.stop = {"Lily"};
  auto stream = engine.submit(r);
  std::string text;
  FinishReason finish = FinishReason::kNone;
  while (auto e = stream->next()) {
    text += e->text;
    if ((finish = e->finish) != FinishReason::kNone) break;
  }
  EXPECT_EQ(text, ", there was a little girl named ");
  EXPECT_EQ(finish, FinishReason::kStop);

  std::vector<std::vector<int32_t>> outs;
  for (uint64_t seed : {7ull, 7ull, 8ull}) {
    Request s;
    s.prompt = "Once upon a time";
    s.sampling.temperature = 1.0f;
    s.sampling.seed = seed;
    s.sampling.max_tokens = 32;
    s.sampling.ignore_eos = true;
    auto st = engine.submit(s);
    std::vector<int32_t> out;
    while (auto e = st->next()) {
      out.insert(out.end(), e->token_ids.begin(), e->token_ids.end());
      if (e->finish != FinishReason::kNone) break;
    }
    outs.push_back(out);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_NE(outs[0], outs[2]);
}

}  // namespace
}  // namespace servetune
