// Microbenchmark for CpuBackend::sample on a decode batch's logits (SmolLM2's 49,152-token vocabulary, 32 rows of
// normal logits, standard deviation 3): plain temperature sampling (what `servetune bench` requests carry), greedy,
// top-p 0.9 and top-k 40. Rows per second counts logits rows drawn.
// Run: bench_sample --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace servetune::cpu {
namespace {

constexpr int64_t kVocab = 49152;

enum Mode { kTemperature = 0, kGreedy = 1, kTopP = 2, kTopK = 3 };

void BM_Sample(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t rows = state.range(1);
  const auto mode = static_cast<Mode>(state.range(2));
  CpuBackend backend(threads);
  std::mt19937 rng(11);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(rows * kVocab));
  for (float& x : logits) x = logit(rng);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<SampleRow> sample_rows(static_cast<size_t>(rows));
  for (SampleRow& r : sample_rows) {
    r.temperature = mode == kGreedy ? 0.0f : 1.0f;
    r.top_p = mode == kTopP ? 0.9f : 1.0f;
    r.top_k = mode == kTopK ? 40 : 0;
    r.uniform = unit(rng);
  }
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  for (auto _ : state) {
    backend.sample(logits.data(), rows, kVocab, sample_rows, tokens.data());
    benchmark::DoNotOptimize(tokens.data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}

BENCHMARK(BM_Sample)
    ->ArgNames({"threads", "rows", "mode"})
    ->Args({1, 32, kTemperature})
    ->Args({2, 32, kTemperature})
    ->Args({1, 1, kTemperature})
    ->Args({2, 32, kGreedy})
    ->Args({2, 32, kTopP})
    ->Args({2, 32, kTopK})
    ->UseRealTime();

}  // namespace
}  // namespace servetune::cpu
