// Microbenchmark for the CPU paged attention on SmolLM2-135M shapes (9 query heads, 3 KV heads of 64, KV cache of
// `kv_bits` 16 (f16) or 8 (FP8 E4M3)): a batched decode step of 32 sequences, a single-sequence decode, both at a
// long context (2048 positions), and a prefill chunk (every position of 32 sequences), blocks handed out shuffled as
// a long-running cache leaves them, pages of 16 unless `page` says otherwise; and a decode step's rotary + KV store
// into evicted pages. `Dram`: each call reads the next of 30 layers' caches (the engine's pattern: a step's KV reads
// come from DRAM); `Cached`: one layer's cache, read again (L2/L3), which isolates the kernel's arithmetic.
// bytes_per_second counts the K and V bytes a decode call must read (a prefill call reads each row many times).
// BM_LatentDecodeDram: the absorbed MLA decode (attention_latent) on DeepSeek-V3's shape, a cache of 576-value latent
// rows (512 latent + 64 rotary key) in f16 with 16 heads (one rank of tensor parallelism 8) or all 128; bytes_per_second
// counts the latent rows alone, which is all the cache holds, against the host's memory bandwidth.
// Run: bench_attention --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/half.h"

namespace servetune::cpu {
namespace {

constexpr int64_t kLayers = 30, kHeads = 9, kKvHeads = 3, kHeadDim = 64;

struct AttentionStep {
  // Per layer, f16 or fp8 elements: K as kv_layout.h lays it out, V [blocks, page, kv heads, head dim]; in the
  // backend's host buffers, as the engine's KV cache (huge pages where the kernel has them).
  std::vector<std::unique_ptr<Buffer>> k, v;
  std::vector<KvLayerView> views;
  std::vector<int32_t> positions, seq_of_token, tables;
  int64_t blocks_per_seq = 0;
  std::vector<float> q, out;
  AttentionBatch batch;
  int64_t kv_bytes_read = 0;

  // Decode: each sequence's last position; prefill: all its positions.
  AttentionStep(CpuBackend& backend, int64_t seqs, int64_t ctx, int64_t page, int64_t layers, bool prefill,
                DType kv_dtype) {
    const auto elem = static_cast<size_t>(dtype_info(kv_dtype).type_size);
    blocks_per_seq = (ctx + page - 1) / page;
    const int64_t blocks = seqs * blocks_per_seq;
    const int64_t block_elems = page * kKvHeads * kHeadDim;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<uint8_t> pattern(4096 * elem);  // 4096 random elements
    for (size_t i = 0; i < 4096; ++i) {
      const float x = dist(rng);
      if (kv_dtype == DType::kF16) {
        const uint16_t h = f32_to_fp16(x);
        std::memcpy(pattern.data() + i * elem, &h, elem);
      } else {
        pattern[i] = f32_to_fp8_e4m3(x);
      }
    }
    for (int64_t l = 0; l < layers; ++l) {
      for (auto* side : {&k, &v}) {
        const size_t elems = static_cast<size_t>(blocks * block_elems);
        side->push_back(backend.allocate(elems * elem));
        auto* data = static_cast<uint8_t*>(side->back()->data());
        for (size_t i = 0; i < elems; ++i) {
          std::memcpy(data + i * elem, pattern.data() + (i * 7 + static_cast<size_t>(l)) % 4096 * elem, elem);
        }
      }
      KvLayerView view;
      view.k = k.back()->data();
      view.v = v.back()->data();
      view.dtype = kv_dtype;
      view.num_blocks = blocks;
      view.page_size = page;
      view.n_kv_heads = kKvHeads;
      view.head_dim = kHeadDim;
      views.push_back(view);
    }
    tables.resize(static_cast<size_t>(blocks));
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
    for (int64_t s = 0; s < seqs; ++s) {
      for (int64_t p = prefill ? 0 : ctx - 1; p < ctx; ++p) {
        positions.push_back(static_cast<int32_t>(p));
        seq_of_token.push_back(static_cast<int32_t>(s));
      }
    }
    q.resize(positions.size() * static_cast<size_t>(kHeads * kHeadDim));
    for (float& x : q) x = dist(rng);
    out.resize(q.size());
    batch.n_tokens = static_cast<int64_t>(positions.size());
    batch.positions = positions.data();
    batch.seq_of_token = seq_of_token.data();
    batch.block_tables = tables.data();
    batch.max_blocks_per_seq = blocks_per_seq;
    kv_bytes_read = seqs * ctx * 2 * kKvHeads * kHeadDim * static_cast<int64_t>(elem);
  }
};

void run_attention(benchmark::State& state, int64_t layers, bool prefill) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t seqs = state.range(1), ctx = state.range(2), page = state.range(3);
  const DType kv_dtype = state.range(4) == 8 ? DType::kFP8_E4M3 : DType::kF16;
  CpuBackend backend(threads);
  AttentionStep step(backend, seqs, ctx, page, layers, prefill, kv_dtype);
  size_t layer = 0;
  for (auto _ : state) {
    backend.attention(step.views[layer], step.batch, step.q.data(), kHeads, 0.125f, step.out.data());
    benchmark::DoNotOptimize(step.out.data());
    layer = (layer + 1) % step.views.size();
  }
  state.SetBytesProcessed(state.iterations() * step.kv_bytes_read);
}

// A decode step's rotary + KV store (rope_store_qkv), the caches evicted between calls as a step's weight and KV
// reads evict them, except the QKV rows the matmul before it just wrote: the transposed K write touches every line
// of the token's page.
void BM_RopeStoreDecodeDram(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t seqs = state.range(1), ctx = state.range(2), page = state.range(3);
  const DType kv_dtype = state.range(4) == 8 ? DType::kFP8_E4M3 : DType::kF16;
  CpuBackend backend(threads);
  AttentionStep step(backend, seqs, ctx, page, kLayers, false, kv_dtype);
  std::vector<int32_t> slots(step.positions.size());
  for (size_t t = 0; t < slots.size(); ++t) {
    const int64_t p = step.positions[t];
    const int64_t s = step.seq_of_token[t];
    slots[t] =
        static_cast<int32_t>(step.tables[static_cast<size_t>(s * step.blocks_per_seq + p / page)] * page + p % page);
  }
  const int64_t row = (kHeads + 2 * kKvHeads) * kHeadDim;
  std::vector<float> qkv(slots.size() * static_cast<size_t>(row));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : qkv) x = dist(rng);
  RopeParams rope;
  rope.head_dim = kHeadDim;
  rope.rope_dim = kHeadDim;
  std::vector<uint8_t> evict(64 << 20, 1);  // read between calls: the step's weights and other caches pass through
  uint64_t evict_sum = 0;
  size_t layer = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (size_t i = 0; i < evict.size(); i += 64) evict_sum += evict[i];
    for (size_t i = 0; i < qkv.size(); i += 16) evict_sum += static_cast<uint64_t>(qkv[i] > 0.0f);  // just written
    benchmark::DoNotOptimize(evict_sum);
    state.ResumeTiming();
    backend.rope_store_qkv(step.views[layer], qkv.data(), step.positions.data(), slots.data(),
                           static_cast<int64_t>(slots.size()), kHeads, rope, step.q.data());
    benchmark::DoNotOptimize(step.q.data());
    layer = (layer + 1) % step.views.size();
  }
}

void BM_AttentionDecodeDram(benchmark::State& state) { run_attention(state, kLayers, false); }
void BM_AttentionDecodeCached(benchmark::State& state) { run_attention(state, 1, false); }
void BM_AttentionPrefill(benchmark::State& state) { run_attention(state, kLayers, true); }

void add_cases(benchmark::internal::Benchmark* b, const std::vector<std::vector<int64_t>>& cases) {
  b->ArgNames({"threads", "seqs", "ctx", "page", "kv_bits"});
  for (const auto& args : cases) {
    for (int64_t bits : {16, 8}) {
      auto with_bits = args;
      with_bits.push_back(bits);
      b->Args(with_bits);
    }
  }
  b->UseRealTime();
}
void decode_cases(benchmark::internal::Benchmark* b) {
  add_cases(
      b, {{1, 32, 192, 16}, {2, 32, 192, 16}, {2, 32, 256, 16}, {2, 32, 192, 256}, {1, 1, 192, 16}, {2, 1, 192, 16},
          {2, 8, 2048, 16}, {2, 1, 2048, 16}});
}
void prefill_cases(benchmark::internal::Benchmark* b) { add_cases(b, {{1, 32, 128, 16}, {2, 32, 128, 16}}); }
// One thread: a second one would sleep through the untimed eviction and be timed waking up.
void store_cases(benchmark::internal::Benchmark* b) { add_cases(b, {{1, 32, 192, 16}}); }
BENCHMARK(BM_AttentionDecodeDram)->Apply(decode_cases);
BENCHMARK(BM_AttentionDecodeCached)->Apply(decode_cases);
BENCHMARK(BM_AttentionPrefill)->Apply(prefill_cases);
BENCHMARK(BM_RopeStoreDecodeDram)->Apply(store_cases)->Iterations(300);  // each call first reads 64 MB

// DeepSeek-V3's latent cache: per token and layer one row of kv_lora_rank 512 + qk_rope_head_dim 64 f16 values; each
// call reads the next of kLatentLayers layers' caches (more bytes than the L3 holds), as a decode step does.
void BM_LatentDecodeDram(benchmark::State& state) {
  constexpr int64_t kRow = 576, kLatent = 512, kLatentLayers = 8, kPage = 16;
  const int threads = static_cast<int>(state.range(0));
  const int64_t seqs = state.range(1), ctx = state.range(2), heads = state.range(3);
  CpuBackend backend(threads);
  const int64_t blocks_per_seq = (ctx + kPage - 1) / kPage, blocks = seqs * blocks_per_seq;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> pattern(4096);
  for (uint16_t& h : pattern) h = f32_to_fp16(dist(rng));
  std::vector<std::unique_ptr<Buffer>> caches;
  std::vector<KvLayerView> views;
  for (int64_t l = 0; l < kLatentLayers; ++l) {
    const auto elems = static_cast<size_t>(blocks * kPage * kRow);
    caches.push_back(backend.allocate(elems * 2));
    auto* data = static_cast<uint16_t*>(caches.back()->data());
    for (size_t i = 0; i < elems; ++i) data[i] = pattern[(i * 7 + static_cast<size_t>(l)) % pattern.size()];
    views.push_back(KvLayerView{data, nullptr, DType::kF16, blocks, kPage, 1, kRow});
  }
  std::vector<int32_t> tables(static_cast<size_t>(blocks)), positions, seq_of_token;
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  for (int64_t s = 0; s < seqs; ++s) {
    positions.push_back(static_cast<int32_t>(ctx - 1));
    seq_of_token.push_back(static_cast<int32_t>(s));
  }
  const AttentionBatch batch{seqs, positions.data(), seq_of_token.data(), tables.data(), blocks_per_seq};
  std::vector<float> q(static_cast<size_t>(seqs * heads * kRow)), out(static_cast<size_t>(seqs * heads * kLatent));
  for (float& x : q) x = dist(rng);
  size_t layer = 0;
  for (auto _ : state) {
    backend.attention_latent(views[layer], batch, q.data(), heads, kLatent, 0.07f, out.data());
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % views.size();
  }
  state.SetBytesProcessed(state.iterations() * seqs * ctx * kRow * 2);
}
BENCHMARK(BM_LatentDecodeDram)
    ->ArgNames({"threads", "seqs", "ctx", "heads"})
    ->Args({1, 1, 4096, 16})
    ->Args({2, 1, 4096, 16})
    ->Args({2, 8, 4096, 16})
    ->Args({2, 1, 4096, 128})
    ->UseRealTime();

}  // namespace
}  // namespace servetune::cpu
