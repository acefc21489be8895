// Encode/decode throughput on ShareGPT prompts (first human turns, as the golden tests select them) for the
// stories260K (SentencePiece) and SmolLM2 (byte-level BPE, smollm pre-tokenizer) vocabularies. Two shapes:
// one encode call per prompt, and one call per ~1 MiB chunk of prompts joined by "\n\n" (what
// scripts/bench_tokenizer.sh compares with llama.cpp). Counters: bytes/s and tokens/s.
#include <benchmark/benchmark.h>

#include <filesystem>

#include "formats/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/test_tokenizer_util.h"

namespace servetune {
namespace {

constexpr size_t kPrompts = 2000;

const std::vector<std::string>& prompts() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    if (!std::filesystem::exists(testing::sharegpt_path())) return out;
    for (auto& [index, text] : testing::sharegpt_prompts(testing::sharegpt_path(), kPrompts)) out.push_back(std::move(text));
    return out;
  }();
  return texts;
}

const std::vector<std::string>& chunks() {
  static const std::vector<std::string> out = [] {
    std::vector<std::string> c(1);
    for (const std::string& p : prompts()) {
      if (c.back().size() > (1u << 20)) c.emplace_back();
      c.back() += p;
      c.back() += "\n\n";
    }
    return c;
  }();
  return out;
}

std::unique_ptr<Tokenizer> load(const std::string& path) {
  GgufFile f(path);
  return Tokenizer::from_gguf(f);
}

void run_encode(benchmark::State& state, const std::string& path, bool chunked) {
  if (!std::filesystem::exists(path) || prompts().empty()) {
    state.SkipWithError("model or ShareGPT file missing; run scripts/setup.sh");
    return;
  }
  auto tok = load(path);
  const auto& texts = chunked ? chunks() : prompts();
  size_t bytes = 0, tokens = 0;
  for (auto _ : state) {
    for (const std::string& t : texts) {
      auto ids = tok->encode(t, true, false);
      tokens += ids.size();
      bytes += t.size();
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

void run_decode(benchmark::State& state, const std::string& path) {
  if (!std::filesystem::exists(path) || prompts().empty()) {
    state.SkipWithError("model or ShareGPT file missing; run scripts/setup.sh");
    return;
  }
  auto tok = load(path);
  std::vector<std::vector<int32_t>> all;
  for (const std::string& t : prompts()) all.push_back(tok->encode(t, false, false));
  size_t tokens = 0, bytes = 0;
  for (auto _ : state) {
    for (const auto& ids : all) {
      std::string s = tok->decode(ids);
      tokens += ids.size();
      bytes += s.size();
      benchmark::DoNotOptimize(s.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(run_encode, stories260K_per_prompt, testing::stories_path(), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run_encode, stories260K_chunks, testing::stories_path(), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run_encode, smollm2_per_prompt, testing::smollm2_path(), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run_encode, smollm2_chunks, testing::smollm2_path(), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run_decode, stories260K, testing::stories_path())->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run_decode, smollm2, testing::smollm2_path())->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace servetune
