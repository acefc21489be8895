// Microbenchmarks for the CPU matmul on SmolLM2-135M shapes: memory bandwidth (streaming read), decode GB/s with
// weights streamed from DRAM (rotating copies > L3) or cache-resident, prefill GFLOP/s, and thread-pool latency; and
// block-scaled FP8 next to BF16 and F32 on a DeepSeek-V3 expert's shape.
// Run: bench_matmul --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/quant.h"

namespace servetune::cpu {
namespace {

constexpr int64_t kColdBytes = int64_t{512} << 20;  // rotating weight copies: 16× the 32 MB L3

struct Shape {
  const char* name;
  int64_t rows, cols;
  DType type;
};

// SmolLM2-135M: hidden 576, 9 heads / 3 KV heads of 64, FFN 1536, vocab 49152 (tied Q8_0 output head).
const Shape kShapes[] = {
    {"attn_q_o_576x576", 576, 576, DType::kQ4_1},   {"attn_kv_192x576", 192, 576, DType::kQ4_1},
    {"ffn_up_1536x576", 1536, 576, DType::kQ4_1},   {"ffn_down_576x1536", 576, 1536, DType::kQ4_1},
    {"output_49152x576", 49152, 576, DType::kQ8_0},
};

// k-quant weights (GGUF Q4_K_M / Q5_K_M models) need cols divisible by 256; random bytes with sane scales stand in for
// real ones. Q4_0 and Q8_0 of the same shape are the yardstick the k-quant kernels are compared with.
const Shape kKShapes[] = {
    {"2048x2048", 2048, 2048, DType::kQ4_0}, {"2048x2048", 2048, 2048, DType::kQ8_0},
    {"2048x2048", 2048, 2048, DType::kQ4_K}, {"2048x2048", 2048, 2048, DType::kQ5_K},
    {"2048x2048", 2048, 2048, DType::kQ6_K},
};

// A DeepSeek-V3 expert's gate / up projection (hidden 7168 -> 2048) as the checkpoint ships it (FP8 with 128x128 block
// scales) and as bf16 / f32 conversions of it would be.
const Shape kFp8Shapes[] = {
    {"expert_2048x7168", 2048, 7168, DType::kFP8_E4M3_B128},
    {"expert_2048x7168", 2048, 7168, DType::kBF16},
    {"expert_2048x7168", 2048, 7168, DType::kF32},
};
// SmolLM2-135M as its checkpoint ships (bf16) and as an f16 GGUF: the float kernels' decode and verify-step shapes.
const Shape kFloatShapes[] = {
    {"ffn_up_1536x576", 1536, 576, DType::kBF16},
    {"ffn_up_1536x576", 1536, 576, DType::kF16},
    {"ffn_down_576x1536", 576, 1536, DType::kBF16},
    {"output_49152x576", 49152, 576, DType::kBF16},
};

constexpr float kFp8Scale = 2.5e-4f;  // every block's: codes of N(0, 0.05) weights span E4M3's range

struct AlignedFree {
  void operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t(64)); }
};
using Buffer = std::unique_ptr<uint8_t, AlignedFree>;

Buffer allocate(int64_t bytes) {
  return Buffer(static_cast<uint8_t*>(::operator new(static_cast<size_t>(bytes), std::align_val_t(64))));
}

// `copies` back-to-back copies of one random quantized matrix (one copy when cold is false).
struct Weights {
  Buffer data;
  int64_t matrix_bytes = 0;
  int64_t copies = 0;
  int64_t row_bytes = 0;
  std::vector<float> scales;  // FP8_E4M3_B128's, shared by the copies

  MatrixView view(const Shape& s, int64_t copy) const {
    return {data.get() + copy * matrix_bytes, s.type, s.rows, s.cols, row_bytes, {scales.data(), (s.cols + 127) / 128, 0}};
  }
};

Weights make_weights(const Shape& s, bool cold) {
  Weights w;
  w.row_bytes = *dtype_row_bytes(s.type, s.cols);
  w.matrix_bytes = (w.row_bytes * s.rows + 4095) / 4096 * 4096;
  w.copies = cold ? std::max<int64_t>(2, kColdBytes / w.matrix_bytes) : 1;
  w.data = allocate(w.matrix_bytes * w.copies);
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> row(static_cast<size_t>(s.cols));
  const bool fp8 = s.type == DType::kFP8_E4M3_B128;
  if (fp8) w.scales.assign(static_cast<size_t>((s.rows + 127) / 128 * ((s.cols + 127) / 128)), kFp8Scale);
  for (int64_t r = 0; r < s.rows; ++r) {
    uint8_t* out = w.data.get() + r * w.row_bytes;
    if (can_quantize(fp8 ? DType::kFP8_E4M3 : s.type)) {
      for (float& f : row) f = fp8 ? dist(rng) / kFp8Scale : dist(rng);
      quantize_row(fp8 ? DType::kFP8_E4M3 : s.type, row.data(), out, s.cols);
      continue;
    }
    for (int64_t i = 0; i < w.row_bytes; ++i) out[i] = static_cast<uint8_t>(rng());
    const int64_t block = dtype_info(s.type).type_size;
    const uint16_t scale =
        0x2000;  // f16 ~0.0078: finite super-block scales (d at the end for Q6_K, d/dmin first for Q4_K, Q5_K)
    for (int64_t off = 0; off < w.row_bytes; off += block) {
      std::memcpy(out + off + (s.type == DType::kQ6_K ? block - 2 : 0), &scale, 2);
      if (s.type == DType::kQ4_K || s.type == DType::kQ5_K) std::memcpy(out + off + 2, &scale, 2);
    }
  }
  for (int64_t i = 1; i < w.copies; ++i) std::memcpy(w.data.get() + i * w.matrix_bytes, w.data.get(), w.matrix_bytes);
  return w;
}

std::vector<float> random_activations(int64_t n) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& f : x) f = dist(rng);
  return x;
}

void bm_stream_read(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t bytes = int64_t{1} << 30;
  Buffer buf = allocate(bytes);
  std::memset(buf.get(), 1, static_cast<size_t>(bytes));
  ThreadPool pool(threads);
  std::vector<uint64_t> sums(static_cast<size_t>(threads) * 8);
  for (auto _ : state) {
    pool.parallel_for(bytes / 64, 1 << 16, [&](int64_t b, int64_t e) {
      const auto* p = reinterpret_cast<const uint64_t*>(buf.get());
      uint64_t acc[8] = {};
      for (int64_t i = b * 8; i < e * 8; i += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
      }
      uint64_t total = 0;
      for (uint64_t v : acc) total += v;
      benchmark::DoNotOptimize(total);
    });
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void bm_decode(benchmark::State& state, Shape s, CpuIsa isa, bool cold) {
  if (!cpu_supports(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  const int64_t n_tokens = state.range(1);
  const Weights w = make_weights(s, cold);
  const std::vector<float> x = random_activations(n_tokens * s.cols);
  std::vector<float> y(static_cast<size_t>(n_tokens * s.rows));
  ThreadPool pool(threads);
  int64_t i = 0;
  for (auto _ : state) {
    const MatrixView view = w.view(s, i % w.copies);
    matmul_with_isa(isa, view, x.data(), n_tokens, s.cols, y.data(), s.rows, pool);
    benchmark::ClobberMemory();
    ++i;
  }
  state.SetBytesProcessed(state.iterations() * w.row_bytes * s.rows);
  state.counters["GFLOPs"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * static_cast<double>(s.rows * s.cols * n_tokens) * 1e-9,
      benchmark::Counter::kIsRate);
}

void bm_prefill(benchmark::State& state, Shape s, CpuIsa isa) {
  if (!cpu_supports(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  const int64_t n_tokens = state.range(1);
  const Weights w = make_weights(s, false);
  const std::vector<float> x = random_activations(n_tokens * s.cols);
  std::vector<float> y(static_cast<size_t>(n_tokens * s.rows));
  ThreadPool pool(threads);
  const MatrixView view = w.view(s, 0);
  for (auto _ : state) {
    matmul_with_isa(isa, view, x.data(), n_tokens, s.cols, y.data(), s.rows, pool);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * static_cast<double>(s.rows * s.cols * n_tokens) * 1e-9,
      benchmark::Counter::kIsRate);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * n_tokens), benchmark::Counter::kIsRate);
}

void bm_pool_run(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    pool.run([](int, int) {});
  }
}

// Registered at static-initialisation time so benchmark_main sees them.
const bool kRegistered = [] {
  benchmark::RegisterBenchmark("stream_read_1GB", bm_stream_read)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("pool_run", bm_pool_run)->ArgName("threads")->Arg(2)->UseRealTime();
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    const std::string isa_name(cpu_isa_name(isa));
    for (const Shape& s : kShapes) {
      for (bool cold : {true, false}) {
        const std::string name =
            "decode/" + isa_name + "/" + s.name + "/" + dtype_name(s.type).data() + (cold ? "/dram" : "/cached");
        benchmark::RegisterBenchmark(name.c_str(), bm_decode, s, isa, cold)
            ->ArgNames({"threads", "tokens"})
            ->Args({1, 1})
            ->Args({2, 1})
            ->Args({2, 4})
            ->Args({1, 2})  // a verify step's 2, 3, 4 tokens, a small batch's 8: the row-pair kernel's passes
            ->Args({1, 3})
            ->Args({1, 4})
            ->Args({1, 8})
            ->Args({1, 32})  // batched decode: 32 sequences, one token each
            ->Args({2, 32})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
      if (s.rows > 10000) continue;  // the output head runs for one token per sequence
      const std::string name = "prefill/" + isa_name + "/" + s.name + "/" + dtype_name(s.type).data();
      benchmark::RegisterBenchmark(name.c_str(), bm_prefill, s, isa)
          ->ArgNames({"threads", "tokens"})
          ->Args({1, 512})
          ->Args({1, 32})
          ->Args({2, 32})
          ->Args({2, 128})
          ->Args({2, 512})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // Filter with --benchmark_filter=kquant/ to compare the k-quant kernels with Q4_0 / Q8_0 per ISA.
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    for (const Shape& s : kKShapes) {
      const std::string name =
          std::string("kquant/") + cpu_isa_name(isa).data() + "/" + s.name + "/" + dtype_name(s.type).data();
      benchmark::RegisterBenchmark((name + "/decode").c_str(), bm_decode, s, isa, false)
          ->ArgNames({"threads", "tokens"})
          ->Args({1, 1})
          ->Args({2, 1})
          ->Args({1, 4})
          ->Args({2, 4})
          ->Args({2, 32})  // batched decode: two token-lane groups
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark((name + "/prefill").c_str(), bm_prefill, s, isa)
          ->ArgNames({"threads", "tokens"})
          ->Args({1, 128})
          ->Args({2, 128})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // Filter with --benchmark_filter=float/ for the f16 / bf16 weight kernels.
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    for (const Shape& s : kFloatShapes) {
      for (bool cold : {true, false}) {
        const std::string name = std::string("float/") + cpu_isa_name(isa).data() + "/" + s.name + "/" +
                                 dtype_name(s.type).data() + (cold ? "/dram" : "/cached");
        benchmark::RegisterBenchmark(name.c_str(), bm_decode, s, isa, cold)
            ->ArgNames({"threads", "tokens"})
            ->Args({1, 1})
            ->Args({2, 1})
            ->Args({1, 2})
            ->Args({1, 4})
            ->Args({2, 4})
            ->Args({2, 8})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    for (const Shape& s : kFp8Shapes) {
      const std::string name = "fp8/" + std::string(cpu_isa_name(isa)) + "/" + s.name + "/" + dtype_name(s.type).data();
      benchmark::RegisterBenchmark((name + "/decode").c_str(), bm_decode, s, isa, true)
          ->ArgNames({"threads", "tokens"})
          ->Args({1, 1})
          ->Args({2, 1})
          ->Args({2, 4})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark((name + "/prefill").c_str(), bm_prefill, s, isa)
          ->ArgNames({"threads", "tokens"})
          ->Args({2, 32})
          ->Args({2, 128})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace servetune::cpu
