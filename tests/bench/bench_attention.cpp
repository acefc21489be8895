// Microbenchmark for the CPU paged attention on SmolLM2-135M shapes (9 query heads, 3 KV heads of 64, f16 KV
// cache, pages of 16): a batched decode step of 32 sequences and a single-sequence decode, blocks handed out shuffled
// as a long-running cache leaves them. `Dram`: each call reads the next of 30 layers' caches (the engine's pattern: a
// step's KV reads come from DRAM); `Cached`: one layer's cache, read again (L2/L3), which isolates the kernel's
// arithmetic. bytes_per_second counts the K and V bytes a call must read.
// Run: bench_attention --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/half.h"

namespace servetune::cpu {
namespace {

constexpr int64_t kLayers = 30, kHeads = 9, kKvHeads = 3, kHeadDim = 64, kPage = 16;

struct DecodeStep {
  std::vector<std::vector<uint16_t>> k, v;  // per layer: [blocks, page, kv heads, head dim] f16
  std::vector<KvLayerView> views;
  std::vector<int32_t> positions, seq_of_token, tables;
  int64_t blocks_per_seq = 0;
  std::vector<float> q, out;
  AttentionBatch batch;
  int64_t kv_bytes_read = 0;

  DecodeStep(int64_t seqs, int64_t ctx, int64_t layers) {
    blocks_per_seq = (ctx + kPage - 1) / kPage;
    const int64_t blocks = seqs * blocks_per_seq;
    const int64_t block_elems = kPage * kKvHeads * kHeadDim;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<uint16_t> pattern(static_cast<size_t>(4096));
    for (auto& h : pattern) h = f32_to_fp16(dist(rng));
    for (int64_t l = 0; l < layers; ++l) {
      for (auto* side : {&k, &v}) {
        side->emplace_back(static_cast<size_t>(blocks * block_elems));
        auto& data = side->back();
        for (size_t i = 0; i < data.size(); ++i) data[i] = pattern[(i * 7 + static_cast<size_t>(l)) % pattern.size()];
      }
      KvLayerView view;
      view.k = k.back().data();
      view.v = v.back().data();
      view.dtype = DType::kF16;
      view.num_blocks = blocks;
      view.page_size = kPage;
      view.n_kv_heads = kKvHeads;
      view.head_dim = kHeadDim;
      views.push_back(view);
    }
    tables.resize(static_cast<size_t>(blocks));
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
    for (int64_t s = 0; s < seqs; ++s) {
      positions.push_back(static_cast<int32_t>(ctx - 1));
      seq_of_token.push_back(static_cast<int32_t>(s));
    }
    q.resize(static_cast<size_t>(seqs * kHeads * kHeadDim));
    for (float& x : q) x = dist(rng);
    out.resize(q.size());
    batch.n_tokens = seqs;
    batch.positions = positions.data();
    batch.seq_of_token = seq_of_token.data();
    batch.block_tables = tables.data();
    batch.max_blocks_per_seq = blocks_per_seq;
    kv_bytes_read = seqs * ctx * 2 * kKvHeads * kHeadDim * static_cast<int64_t>(sizeof(uint16_t));
  }
};

void attention_decode(benchmark::State& state, int64_t layers) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t seqs = state.range(1), ctx = state.range(2);
  CpuBackend backend(threads);
  DecodeStep step(seqs, ctx, layers);
  size_t layer = 0;
  for (auto _ : state) {
    backend.attention(step.views[layer], step.batch, step.q.data(), kHeads, 0.125f, step.out.data());
    benchmark::DoNotOptimize(step.out.data());
    layer = (layer + 1) % step.views.size();
  }
  state.SetBytesProcessed(state.iterations() * step.kv_bytes_read);
}

void BM_AttentionDecodeDram(benchmark::State& state) { attention_decode(state, kLayers); }
void BM_AttentionDecodeCached(benchmark::State& state) { attention_decode(state, 1); }

void decode_cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "seqs", "ctx"});
  for (const auto& args :
       std::vector<std::vector<int64_t>>{{1, 32, 192}, {2, 32, 192}, {2, 32, 256}, {1, 1, 192}, {2, 1, 192}}) {
    b->Args(args);
  }
  b->UseRealTime();
}
BENCHMARK(BM_AttentionDecodeDram)->Apply(decode_cases);
BENCHMARK(BM_AttentionDecodeCached)->Apply(decode_cases);

}  // namespace
}  // namespace servetune::cpu
