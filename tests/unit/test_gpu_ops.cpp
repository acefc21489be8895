// Every GPU backend op (the fused ones of compile = fused and the on-device random fill included) against the CPU
// reference on random inputs of awkward sizes and on the Llama-3-8B shape's (GEMMs of 4096 x 14336, head_dim 128 and
// 256, page size 16, contexts of over a thousand): f32 paths within 1e-5 relative error (of the largest reference
// value), bf16 GEMMs within 1e-2, the tensor-core prefill attention within its f16/bf16 rounding; f32, f16, bf16 and FP8 E4M3 KV caches; the tiled GEMM (the HIP build's) through
// SERVETUNE_GPU_GEMM=tiled; flash-decoding split attention for small batches with contexts up to 5000; and a kernel
// fault under the sync check naming its op; uploads and downloads through pinned staging; the bf16 copies producer ops
// write for the next GEMM (bit-equal to the cast they replace). Skips, saying why, when no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops_reference.h"
#include "backend/cuda/gpu_backend.h"
#include "core/half.h"
#include "gpu_test_support.h"

namespace servetune {
namespace {

using gpu_test::random_floats;
using gpu_test::rel_error;

// bf16 bit patterns of `values` (round to nearest even) and the floats they stand for.
struct Bf16Values {
  std::vector<uint16_t> bits;
  std::vector<float> rounded;
};
Bf16Values to_bf16(const std::vector<float>& values) { return {gpu_test::bf16_bits(values), gpu_test::bf16_rounded(values)}; }

class GpuOps : public gpu_test::GpuFixture {
 protected:
  float* dev_zeros(size_t n) { return dev(std::vector<float>(n, 0.0f)); }
  // GPU against CPU attention for sequences with cached[s] positions already in the cache and fresh[s] new tokens;
  // returns the chunks per token the GPU split the batch into (1: the single-pass kernel).
  int64_t check_paged_attention(DType kv_dtype, int64_t head_dim, int64_t n_heads, int64_t n_kv,
                                const std::vector<int64_t>& cached, const std::vector<int64_t>& fresh, int64_t page);
  void check_paged_attention(DType kv_dtype, int64_t head_dim, int64_t n_heads, int64_t n_kv, int64_t prefill,
                             int64_t page = 3) {
    // Three sequences: a prefill from position 0, a chunk continuing cached positions, one decode token. The
    // 300-token prefill gives enough (token, KV head) pairs for the grouped kernel, the 50-token one keeps one block
    // per query head.
    EXPECT_EQ(check_paged_attention(kv_dtype, head_dim, n_heads, n_kv, {0, 20, 44}, {prefill, 7, 1}, page), 1)
        << "a prefill batch takes the single-pass kernel";
  }
};

// Uploads through the pinned staging ring, many more bytes than it holds without a synchronize between them (so it
// wraps and waits for its own earlier copies), each source overwritten right after its upload returns; sizes from 1
// byte to past the staged limit (direct copies), and downloads staged and direct. Every buffer holds what was sent.
TEST_F(GpuOps, StagedUploadsAndDownloadsKeepEveryByte) {
  std::mt19937 rng(9);
  const size_t sizes[] = {1, 3, 4096, 65536, size_t{1} << 20, (size_t{3} << 20) + 5, (size_t{5} << 20) + 1};
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<std::vector<uint8_t>> sent;
  std::vector<uint8_t> source;
  for (int i = 0; i < 60; ++i) {
    const size_t bytes = sizes[static_cast<size_t>(i) % std::size(sizes)];
    source.resize(bytes);
    for (auto& b : source) b = static_cast<uint8_t>(rng());
    buffers.push_back(gpu_->allocate(bytes));
    gpu_->upload(*buffers.back(), 0, source.data(), bytes);
    sent.push_back(source);
    std::fill(source.begin(), source.end(), uint8_t{0xAB});  // the caller may reuse its memory at once
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    std::vector<uint8_t> back(sent[i].size());
    gpu_->download(back.data(), *buffers[i], 0, back.size());
    ASSERT_EQ(back, sent[i]) << "buffer " << i << " of " << sent[i].size() << " bytes";
  }
}

TEST_F(GpuOps, EmbedF32F16Bf16Tables) {
  const int64_t rows = 37, cols = 75, n = 11;
  const auto values = random_floats(static_cast<size_t>(rows * cols), 1);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) ids.push_back(static_cast<int32_t>((t * 7 + 3) % rows));
  std::vector<uint16_t> f16(values.size()), bf16(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    f16[i] = f32_to_fp16(values[i]);
    bf16[i] = f32_to_bf16(values[i]);
  }
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16}) {
    const void* host_data = type == DType::kF32 ? static_cast<const void*>(values.data())
                            : type == DType::kF16 ? static_cast<const void*>(f16.data()) : static_cast<const void*>(bf16.data());
    const int64_t elem = type == DType::kF32 ? 4 : 2;
    WeightMatrix table{host_data, type, rows, cols, cols * elem};
    std::vector<float> expected(static_cast<size_t>(n * cols));
    cpu::ref::embed(table, ids.data(), n, expected.data());
    const void* device_data = type == DType::kF32 ? static_cast<const void*>(dev(values))
                              : type == DType::kF16 ? static_cast<const void*>(dev(f16)) : static_cast<const void*>(dev(bf16));
    WeightMatrix device_table{device_data, type, rows, cols, cols * elem};
    float* out = dev_zeros(expected.size());
    gpu_->embed(device_table, dev(ids), n, out);
    EXPECT_EQ(host(out, expected.size()), expected) << dtype_name(type);
  }
}

TEST_F(GpuOps, RmsNorm) {
  for (int64_t dim : {1, 300, 4097}) {
    const int64_t n = 5;
    const auto x = random_floats(static_cast<size_t>(n * dim), 2, -3.0f, 3.0f);
    const auto w = random_floats(static_cast<size_t>(dim), 3);
    std::vector<float> expected(x.size());
    cpu::ref::rms_norm(x.data(), w.data(), expected.data(), n, dim, 1e-5f);
    float* y = dev_zeros(x.size());
    gpu_->rms_norm(dev(x), dev(w), y, n, dim, 1e-5f);
    EXPECT_LT(rel_error(host(y, x.size()), expected), 1e-5) << "dim " << dim;
  }
}

// The bf16 copy rms_norm, add_rms_norm and silu_mul write of their outputs feeds the next bf16 GEMM of exactly those
// outputs in place of a cast: bit for bit the cast's result (both round the same floats), and never once the values
// have changed (an add in between) or another op ran.
TEST_F(GpuOps, ProducersBf16CopyFeedsOnlyTheNextGemmOfTheirOutput) {
  const int64_t n = 5, dim = 256, rows = 96;
  const Bf16Values w = to_bf16(random_floats(static_cast<size_t>(rows * dim), 40));
  const WeightMatrix weights{dev(w.bits), DType::kBF16, rows, dim, dim * 2};
  const float* x = dev(random_floats(static_cast<size_t>(n * dim), 41, -3.0f, 3.0f));
  const float* norm = dev(random_floats(static_cast<size_t>(dim), 42));
  const float* zeros = dev_zeros(static_cast<size_t>(n * dim));
  const float* ones = dev(std::vector<float>(static_cast<size_t>(n * dim), 1.0f));
  float* y = dev_zeros(static_cast<size_t>(n * dim));
  const auto product = [&](const std::function<void()>& produce) {
    float* out = dev_zeros(static_cast<size_t>(n * rows));
    produce();
    gpu_->matmul(weights, nullptr, y, n, out);
    return host(out, static_cast<size_t>(n * rows));
  };
  const auto norm_y = [&] { gpu_->rms_norm(x, norm, y, n, dim, 1e-5f); };
  const auto copied = product(norm_y);
  const auto cast = product([&] { norm_y(); gpu_->add(y, zeros, n * dim); });  // same values, the copy dropped
  EXPECT_EQ(copied, cast) << "rms_norm";
  float* residual = dev(random_floats(static_cast<size_t>(n * dim), 43));
  const auto add_norm = [&] { gpu_->add_rms_norm(residual, zeros, norm, y, n, dim, 1e-5f); };
  EXPECT_EQ(product(add_norm), product([&] { add_norm(); gpu_->add(y, zeros, n * dim); })) << "add_rms_norm";
  const float* gate = dev(random_floats(static_cast<size_t>(n * dim), 44));
  const float* up = dev(random_floats(static_cast<size_t>(n * dim), 45));
  const auto silu = [&] { gpu_->silu_mul(gate, up, dim, n, dim, y); };
  EXPECT_EQ(product(silu), product([&] { silu(); gpu_->add(y, zeros, n * dim); })) << "silu_mul";
  // Changed values: the GEMM must see y + 1, as a cast of it gives, not the norm's copy.
  const auto changed = product([&] { norm_y(); gpu_->add(y, ones, n * dim); });
  EXPECT_EQ(changed, product([&] { norm_y(); gpu_->add(y, ones, n * dim); gpu_->add(y, zeros, n * dim); }));
  EXPECT_NE(changed, copied);
}

// y = x W^T (+ bias) through the GPU GEMM against the CPU backend's f32 matmul on the same weights.
TEST_F(GpuOps, MatmulF32WeightsFp32Accurate) {
  for (int64_t n : {1, 3, 33}) {
    const int64_t rows = 67, cols = 129;
    const auto w = random_floats(static_cast<size_t>(rows * cols), 4);
    const auto x = random_floats(static_cast<size_t>(n * cols), 5);
    const auto b = random_floats(static_cast<size_t>(rows), 6);
    cpu::CpuBackend cpu(1);
    std::vector<float> expected(static_cast<size_t>(n * rows));
    cpu.matmul(WeightMatrix{w.data(), DType::kF32, rows, cols, cols * 4}, b.data(), x.data(), n, expected.data());
    float* y = dev_zeros(expected.size());
    gpu_->matmul(WeightMatrix{dev(w), DType::kF32, rows, cols, cols * 4}, dev(b), dev(x), n, y);
    EXPECT_LT(rel_error(host(y, expected.size()), expected), 1e-5) << "n " << n;
  }
}

TEST_F(GpuOps, MatmulBf16WeightsWithinBf16Error) {
  for (int64_t n : {1, 7, 130}) {
    const int64_t rows = 257, cols = 96;
    const auto wf = random_floats(static_cast<size_t>(rows * cols), 7);
    const auto [w, w_rounded] = to_bf16(wf);
    const auto x = random_floats(static_cast<size_t>(n * cols), 8);
    cpu::CpuBackend cpu(1);
    std::vector<float> expected(static_cast<size_t>(n * rows));
    cpu.matmul(WeightMatrix{w_rounded.data(), DType::kF32, rows, cols, cols * 4}, nullptr, x.data(), n, expected.data());
    float* y = dev_zeros(expected.size());
    gpu_->matmul(WeightMatrix{dev(w), DType::kBF16, rows, cols, cols * 2}, nullptr, dev(x), n, y);
    EXPECT_LT(rel_error(host(y, expected.size()), expected), 1e-2) << "n " << n;
  }
}

// The Llama-3-8B shape's GEMMs (fused QKV 6144 x 4096, down 4096 x 14336) at decode and prefill-chunk sizes: cuBLAS
// picks other kernels (split-K, large tiles) at these sizes than at the small ones above.
TEST_F(GpuOps, MatmulBf16WeightsLlama8BShapes) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{6144, 4096}, {4096, 14336}}) {
    const auto wf = random_floats(static_cast<size_t>(rows * cols), 40);
    const auto [w, w_rounded] = to_bf16(wf);
    const uint16_t* w_dev = dev(w);
    cpu::CpuBackend cpu(8);
    for (int64_t n : {1, 64}) {
      const auto x = random_floats(static_cast<size_t>(n * cols), 41);
      std::vector<float> expected(static_cast<size_t>(n * rows));
      cpu.matmul(WeightMatrix{w_rounded.data(), DType::kF32, rows, cols, cols * 4}, nullptr, x.data(), n, expected.data());
      float* y = dev_zeros(expected.size());
      gpu_->matmul(WeightMatrix{w_dev, DType::kBF16, rows, cols, cols * 2}, nullptr, dev(x), n, y);
      EXPECT_LT(rel_error(host(y, expected.size()), expected), 1e-2) << rows << "x" << cols << " n " << n;
    }
  }
}

// The tiled GEMM (gemm.cu; the HIP build's only GEMM) on f32 and bf16 weights, with tile tails in every dimension. It
// multiplies f32 activations (no bf16 cast), so both types match the f32 reference on the same weight values.
TEST_F(GpuOps, TiledGemmF32AndBf16Weights) {
  setenv("SERVETUNE_GPU_GEMM", "tiled", 1);
  std::unique_ptr<Backend> tiled = make_backend(gpu_backend_name(), 1);
  unsetenv("SERVETUNE_GPU_GEMM");
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{257, 96}, {70, 1001}}) {
    const auto wf = random_floats(static_cast<size_t>(rows * cols), 42);
    const auto [w, w_rounded] = to_bf16(wf);
    cpu::CpuBackend cpu(1);
    for (int64_t n : {1, 7, 130}) {
      const auto x = random_floats(static_cast<size_t>(n * cols), 43);
      const auto b = random_floats(static_cast<size_t>(rows), 44);
      for (DType type : {DType::kF32, DType::kBF16}) {
        const std::vector<float>& w_values = type == DType::kF32 ? wf : w_rounded;
        std::vector<float> expected(static_cast<size_t>(n * rows));
        cpu.matmul(WeightMatrix{w_values.data(), DType::kF32, rows, cols, cols * 4}, b.data(), x.data(), n, expected.data());
        const void* w_dev = type == DType::kF32 ? static_cast<const void*>(dev(wf)) : static_cast<const void*>(dev(w));
        float* y = dev_zeros(expected.size());
        tiled->matmul(WeightMatrix{w_dev, type, rows, cols, cols * (type == DType::kF32 ? 4 : 2)}, dev(b), dev(x), n, y);
        tiled->synchronize();
        EXPECT_LT(rel_error(host(y, expected.size()), expected), 1e-5)
            << dtype_name(type) << " " << rows << "x" << cols << " n " << n;
      }
    }
  }
}

TEST_F(GpuOps, RopeNormalAndNeoxWithFreqFactors) {
  const int64_t n = 9, n_heads = 3, head_dim = 64;
  std::vector<int32_t> positions;
  for (int64_t t = 0; t < n; ++t) positions.push_back(static_cast<int32_t>(t * t * 61));  // up to 3904
  const auto factors = random_floats(static_cast<size_t>(head_dim / 4), 9, 1.0f, 8.0f);
  for (bool neox : {false, true}) {
    for (bool with_factors : {false, true}) {
      RopeParams p;
      p.head_dim = head_dim;
      p.rope_dim = head_dim / 2;  // partial rotary: the rest passes through
      p.theta = 500000.0f;
      p.freq_scale = 0.5f;
      p.neox = neox;
      p.freq_factors = with_factors ? factors.data() : nullptr;
      auto expected = random_floats(static_cast<size_t>(n * n_heads * head_dim), 10);
      float* x = dev(expected);
      cpu::ref::rope(expected.data(), positions.data(), n, n_heads, p);
      RopeParams pd = p;
      pd.freq_factors = with_factors ? dev(factors) : nullptr;
      gpu_->rope(x, dev(positions), n, n_heads, pd);
      EXPECT_LT(rel_error(host(x, expected.size()), expected), 1e-5) << "neox " << neox << " factors " << with_factors;
    }
  }
}

TEST_F(GpuOps, SiluMulStridedAndAdd) {
  const int64_t n = 13, ffn = 333, stride = 400;
  const auto gate = random_floats(static_cast<size_t>(n * stride), 11, -6.0f, 6.0f);
  const auto up = random_floats(static_cast<size_t>(n * stride), 12);
  std::vector<float> expected(static_cast<size_t>(n * ffn));
  cpu::ref::silu_mul(gate.data(), up.data(), stride, n, ffn, expected.data());
  float* out = dev_zeros(expected.size());
  gpu_->silu_mul(dev(gate), dev(up), stride, n, ffn, out);
  EXPECT_LT(rel_error(host(out, expected.size()), expected), 1e-5);

  auto sum = random_floats(1001, 13);
  const auto y = random_floats(1001, 14);
  float* xs = dev(sum);
  gpu_->add(xs, dev(y), 1001);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
  EXPECT_EQ(host(xs, sum.size()), sum);
}

TEST_F(GpuOps, FusedAddRmsNormMatchesReference) {
  const int64_t n = 6, dim = 513;
  const auto x0 = random_floats(static_cast<size_t>(n * dim), 30, -2.0f, 2.0f);
  const auto residual = random_floats(x0.size(), 31);
  const auto w = random_floats(static_cast<size_t>(dim), 32);
  std::vector<float> x_ref = x0, y_ref(x0.size());
  cpu::ref::add_rms_norm(x_ref.data(), residual.data(), w.data(), y_ref.data(), n, dim, 1e-5f);
  float* x = dev(x0);
  float* y = dev(residual);  // the output aliases the residual, as in the fused layer path
  gpu_->add_rms_norm(x, y, dev(w), y, n, dim, 1e-5f);
  EXPECT_EQ(host(x, x0.size()), x_ref);
  EXPECT_LT(rel_error(host(y, x0.size()), y_ref), 1e-5);
}

TEST_F(GpuOps, FusedRopeStoreQkvMatchesReference) {
  for (DType kv_dtype : {DType::kF32, DType::kF16}) {
    for (bool neox : {false, true}) {
      const int64_t n = 9, n_heads = 12, n_kv = 4, hd = 96, page = 5, num_blocks = 4;
      RopeParams p;
      p.head_dim = hd;
      p.rope_dim = 64;
      p.theta = 10000.0f;
      p.neox = neox;
      const int64_t qw = n_heads * hd, kvw = n_kv * hd, row = qw + 2 * kvw;
      const auto qkv = random_floats(static_cast<size_t>(n * row), 33);
      const std::vector<int32_t> positions = {0, 1, 2, 30, 31, 700, 701, 702, 5}, slots = {0, 1, 2, 3, 4, 10, 11, 12, 19};
      const size_t elem = kv_dtype == DType::kF16 ? 2 : 4, cache_bytes = static_cast<size_t>(num_blocks * page * kvw) * elem;
      std::vector<uint8_t> k_ref(cache_bytes, 0), v_ref(cache_bytes, 0);
      const KvLayerView ref_kv{k_ref.data(), v_ref.data(), kv_dtype, num_blocks, page, n_kv, hd};
      std::vector<float> q_ref(static_cast<size_t>(n * qw)), cos_sin(static_cast<size_t>(p.rope_dim)), k_tmp(static_cast<size_t>(kvw));
      for (int64_t t = 0; t < n; ++t) {
        cpu::ref::rope_store_qkv_row(ref_kv, qkv.data() + t * row, static_cast<float>(positions[static_cast<size_t>(t)]),
                                     slots[static_cast<size_t>(t)], n_heads, p, q_ref.data() + t * qw, cos_sin.data(), k_tmp.data());
      }
      auto gk = gpu_->allocate(cache_bytes), gv = gpu_->allocate(cache_bytes);
      const std::vector<uint8_t> zeros(cache_bytes, 0);
      gpu_->upload(*gk, 0, zeros.data(), cache_bytes);
      gpu_->upload(*gv, 0, zeros.data(), cache_bytes);
      const KvLayerView gkv{gk->data(), gv->data(), kv_dtype, num_blocks, page, n_kv, hd};
      float* q = dev_zeros(q_ref.size());
      gpu_->rope_store_qkv(gkv, dev(qkv), dev(positions), dev(slots), n, n_heads, p, q);
      EXPECT_LT(rel_error(host(q, q_ref.size()), q_ref), 1e-5) << "neox " << neox;
      std::vector<uint8_t> k(cache_bytes), v(cache_bytes);
      gpu_->download(k.data(), *gk, 0, cache_bytes);
      gpu_->download(v.data(), *gv, 0, cache_bytes);
      EXPECT_EQ(v, v_ref) << "v is copied unchanged";
      // k went through cos/sin: compare as values.
      std::vector<float> kf(static_cast<size_t>(num_blocks * page * kvw)), kf_ref(kf.size());
      for (size_t i = 0; i < kf.size(); ++i) {
        if (kv_dtype == DType::kF16) {
          uint16_t a, b;
          std::memcpy(&a, k.data() + 2 * i, 2);
          std::memcpy(&b, k_ref.data() + 2 * i, 2);
          kf[i] = fp16_to_f32(a), kf_ref[i] = fp16_to_f32(b);
        } else {
          std::memcpy(&kf[i], k.data() + 4 * i, 4);
          std::memcpy(&kf_ref[i], k_ref.data() + 4 * i, 4);
        }
      }
      EXPECT_LT(rel_error(kf, kf_ref), kv_dtype == DType::kF16 ? 1e-3 : 1e-5) << "neox " << neox;
    }
  }
}

// The FP8 cache's encoder stores core's f32_to_fp8_e4m3 codes for every code's value, the midpoints between neighbours
// (ties to even), subnormals, values past 448 and non-finite ones.
TEST_F(GpuOps, Fp8CacheStoresCoresCodes) {
  std::vector<float> values;
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c)), next = fp8_e4m3_to_f32(static_cast<uint8_t>(c + 1));
    values.push_back(v);
    if (std::isfinite(v) && std::isfinite(next) && (c & 0x7F) != 0x7F) values.push_back(0.5f * (v + next));
  }
  for (float v : {448.0f, 463.9f, 464.0f, 1e9f, 0x1p-10f, 0x1p-11f, 3e-40f, INFINITY, -INFINITY, NAN}) {
    values.push_back(v);
    values.push_back(-v);
  }
  const int64_t head_dim = 16, n = static_cast<int64_t>((values.size() + 15) / 16);
  values.resize(static_cast<size_t>(n * head_dim), 0.0f);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) slots[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  const std::vector<uint8_t> zeros(values.size(), 0);
  uint8_t* k = dev(zeros);
  const KvLayerView kv{k, dev(zeros), DType::kFP8_E4M3, 1, n, 1, head_dim};
  gpu_->store_kv(kv, dev(values), dev(values), dev(slots), n);
  const std::vector<uint8_t> codes = host<uint8_t>(k, values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(codes[i], f32_to_fp8_e4m3(values[i])) << "value " << values[i] << " (element " << i << ")";
  }
}

TEST_F(GpuOps, FillRandomDrawsNormalValuesDeterministically) {
  const int64_t n = 100001;
  for (DType type : {DType::kF32, DType::kBF16}) {
    const size_t bytes = static_cast<size_t>(n) * (type == DType::kF32 ? 4 : 2);
    auto a = gpu_->allocate(bytes), b = gpu_->allocate(bytes);
    ASSERT_TRUE(gpu_->fill_random(a->data(), type, n, 42, 0.5f, 0.02f));
    ASSERT_TRUE(gpu_->fill_random(b->data(), type, n, 42, 0.5f, 0.02f));
    std::vector<uint8_t> ha(bytes), hb(bytes);
    gpu_->download(ha.data(), *a, 0, bytes);
    gpu_->download(hb.data(), *b, 0, bytes);
    EXPECT_EQ(ha, hb) << "same seed, same values";
    double sum = 0.0, sq = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = 0;
      float v = 0.0f;
      if (type == DType::kF32) {
        std::memcpy(&v, ha.data() + i * 4, 4);
      } else {
        std::memcpy(&h, ha.data() + i * 2, 2);
        v = bf16_to_f32(h);
      }
      sum += v;
      sq += static_cast<double>(v) * v;
    }
    const double mean = sum / n, std = std::sqrt(sq / n - mean * mean);
    EXPECT_NEAR(mean, 0.5, 1e-3) << dtype_name(type);
    EXPECT_NEAR(std, 0.02, 0.02 * 0.05) << dtype_name(type);
  }
}

// The sequences in one flattened batch, pages of `page` slots with the block tables interleaving the sequences'
// blocks; K/V stored through store_kv on both backends. A bf16 cache (GPU only) is checked against the CPU's f32
// cache holding the same values rounded to bf16.
int64_t GpuOps::check_paged_attention(DType kv_dtype, int64_t head_dim, int64_t n_heads, int64_t n_kv,
                                      const std::vector<int64_t>& cached, const std::vector<int64_t>& fresh, int64_t page) {
  const auto n_seqs = static_cast<int64_t>(cached.size());
  int64_t longest = 1;
  for (int64_t s = 0; s < n_seqs; ++s) longest = std::max(longest, cached[s] + fresh[s]);
  const int64_t max_blocks = (longest + page - 1) / page;
  const int64_t num_blocks = n_seqs * max_blocks;
  std::vector<int32_t> tables(static_cast<size_t>(n_seqs * max_blocks));
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int64_t b = 0; b < max_blocks; ++b) tables[static_cast<size_t>(s * max_blocks + b)] = static_cast<int32_t>(b * n_seqs + (n_seqs - 1 - s));
  }
  std::vector<int32_t> positions, seq_of_token, slots, old_slots;
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int64_t p = 0; p < cached[s] + fresh[s]; ++p) {
      const int32_t slot = static_cast<int32_t>(tables[static_cast<size_t>(s * max_blocks + p / page)] * page + p % page);
      if (p < cached[s]) {
        old_slots.push_back(slot);
        continue;
      }
      positions.push_back(static_cast<int32_t>(p));
      seq_of_token.push_back(static_cast<int32_t>(s));
      slots.push_back(slot);
    }
  }
  const int64_t n = static_cast<int64_t>(positions.size()), n_old = static_cast<int64_t>(old_slots.size());
  const int64_t width = n_kv * head_dim;
  const auto k_old = random_floats(static_cast<size_t>(n_old * width), 20);
  const auto v_old = random_floats(static_cast<size_t>(n_old * width), 21);
  const auto k_new = random_floats(static_cast<size_t>(n * width), 22);
  const auto v_new = random_floats(static_cast<size_t>(n * width), 23);
  const auto q = random_floats(static_cast<size_t>(n * n_heads * head_dim), 24, -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const size_t cache_bytes = static_cast<size_t>(num_blocks * page * width * dtype_info(kv_dtype).type_size);

  const bool bf16 = kv_dtype == DType::kBF16;
  const auto rounded = [&](const std::vector<float>& v) { return bf16 ? to_bf16(v).rounded : v; };
  const DType cpu_dtype = bf16 ? DType::kF32 : kv_dtype;
  const size_t cpu_cache_bytes = static_cast<size_t>(num_blocks * page * width) * (cpu_dtype == DType::kF32 ? 4 : 2);
  cpu::CpuBackend cpu(4);
  auto ck = cpu.allocate(cpu_cache_bytes), cv = cpu.allocate(cpu_cache_bytes);
  const KvLayerView ckv{ck->data(), cv->data(), cpu_dtype, num_blocks, page, n_kv, head_dim};
  cpu.store_kv(ckv, rounded(k_old).data(), rounded(v_old).data(), old_slots.data(), n_old);
  cpu.store_kv(ckv, rounded(k_new).data(), rounded(v_new).data(), slots.data(), n);
  std::vector<float> expected(q.size());
  cpu.attention(ckv, AttentionBatch{n, positions.data(), seq_of_token.data(), tables.data(), max_blocks}, q.data(),
                n_heads, scale, expected.data());

  auto gk = gpu_->allocate(cache_bytes), gv = gpu_->allocate(cache_bytes);
  const KvLayerView gkv{gk->data(), gv->data(), kv_dtype, num_blocks, page, n_kv, head_dim};
  gpu_->store_kv(gkv, dev(k_old), dev(v_old), dev(old_slots), n_old);
  gpu_->store_kv(gkv, dev(k_new), dev(v_new), dev(slots), n);
  float* out = dev_zeros(q.size());
  const AttentionBatch batch{n, dev(positions), dev(seq_of_token), dev(tables), max_blocks};
  gpu_->attention(gkv, batch, dev(q), n_heads, scale, out);
  const int64_t chunks = gpu_attention_chunks(gkv, batch, n_heads);
  // Batches of 64+ tokens with f16/bf16 caches and head_dim 64/128 run on tensor cores with Q and P rounded to the
  // cache's type (test_gpu_prefill_attention.cpp explains its tolerances); the other kernels compute in f32.
  const bool tensor_cores = gpu_attention_tensor_cores(gkv, batch, n_heads);
  EXPECT_LT(rel_error(host(out, q.size()), expected), tensor_cores ? (bf16 ? 2e-2 : 3e-3) : 1e-5)
      << (tensor_cores ? "tensor cores " : "") << dtype_name(kv_dtype) << " head_dim " << head_dim << " heads " << n_heads << "/" << n_kv << " page " << page
      << " longest " << longest << " tokens " << n << " chunks " << chunks;
  return chunks;
}

TEST_F(GpuOps, PagedAttentionPrefillAndDecodeF32AndF16Cache) {
  for (DType kv_dtype : {DType::kF32, DType::kF16}) {
    for (int64_t head_dim : {40, 128}) {
      for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{6, 2}, {16, 2}}) {
        for (int64_t prefill : {50, 300}) check_paged_attention(kv_dtype, head_dim, n_heads, n_kv, prefill);
      }
    }
  }
}

TEST_F(GpuOps, PagedAttentionBf16Cache) {
  for (int64_t head_dim : {40, 128}) {
    for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{6, 2}, {16, 2}}) {
      for (int64_t prefill : {50, 300}) check_paged_attention(DType::kBF16, head_dim, n_heads, n_kv, prefill);
    }
  }
}

// head_dim 256 (Gemma's; the grouped kernel serves 4 query heads per block there), the engine's default page of 16,
// and a 1200-token prefill (contexts far past the 344 positions above); the 8B shape's 32/8 heads at head_dim 128.
TEST_F(GpuOps, PagedAttentionHeadDim256Page16LongContexts) {
  for (DType kv_dtype : {DType::kF16, DType::kBF16}) {
    for (int64_t prefill : {50, 300, 1200}) {
      check_paged_attention(kv_dtype, 256, 16, 2, prefill, 16);
      check_paged_attention(kv_dtype, 256, 8, 8, prefill, 16);
      check_paged_attention(kv_dtype, 128, 32, 8, prefill, 16);
    }
  }
  check_paged_attention(DType::kF32, 256, 16, 2, 300, 16);
}

// The FP8 E4M3 cache (a byte per element, stored as core's f32_to_fp8_e4m3 stores it: the CPU's FP8 cache holds the
// same codes, so both attend over the same values): prefill and decode through the single-pass and grouped kernels
// (head_dim 40 and 128), and flash-decoding's 16-byte loads of 16 codes at head_dim 64, 128 and 256.
TEST_F(GpuOps, PagedAttentionFp8Cache) {
  for (int64_t head_dim : {40, 128}) {
    for (int64_t prefill : {50, 300}) check_paged_attention(DType::kFP8_E4M3, head_dim, 16, 2, prefill);
  }
  for (int64_t head_dim : {64, 128, 256}) {
    EXPECT_GT(check_paged_attention(DType::kFP8_E4M3, head_dim, 32, 8, {0, 16, 999, 4999}, {1, 1, 1, 1}, 16), 1);
  }
}

// Flash-decoding (decode_attention_split.cu): decode tokens with contexts up to 5000 split into chunks of whole pages
// (16 and 256 slots), head_dim 64/128/256, every KV type, GQA 32/8 and MHA 4/4. A batch of four mixes a 1-position
// context (it uses one chunk; the others' later chunks are skipped for it), 17 (two pages of 16), 1000 and 5000; a
// batch of one (the 8B shape's batch-1 decode) has 5000.
TEST_F(GpuOps, SplitDecodeAttentionLongContexts) {
  for (DType kv_dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t head_dim : {64, 128, 256}) {
      for (int64_t page : {16, 256}) {
        for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{32, 8}, {4, 4}}) {
          EXPECT_GT(check_paged_attention(kv_dtype, head_dim, n_heads, n_kv, {0, 16, 999, 4999}, {1, 1, 1, 1}, page), 1);
        }
        EXPECT_GT(check_paged_attention(kv_dtype, head_dim, 32, 8, {4999}, {1}, page), 1);
      }
    }
  }
  // One token of 1000 positions with pages of 16 (63 pages: the last chunk is partial); one of 17 is too short to split.
  EXPECT_GT(check_paged_attention(DType::kBF16, 128, 32, 8, {999}, {1}, 16), 1);
  EXPECT_EQ(check_paged_attention(DType::kBF16, 128, 32, 8, {16}, {1}, 16), 1);
}

// Big batches fill the GPU without splitting (48 tokens x 8 KV heads: 384 blocks, against the split's aim of 4 per
// SM: 528 on an H100 or H200), and head_dims the split kernel does not take keep the single-pass kernel.
TEST_F(GpuOps, SplitDecodeAttentionLeavesBigBatchesAndOtherHeadDimsSinglePass) {
  const std::vector<int64_t> cached(48, 299), fresh(48, 1);
  EXPECT_EQ(check_paged_attention(DType::kBF16, 128, 32, 8, cached, fresh, 16), 1);
  EXPECT_EQ(check_paged_attention(DType::kF16, 40, 6, 2, {4999}, {1}, 16), 1);  // head_dim 40: the single-pass kernel
}

}  // namespace
}  // namespace servetune

namespace servetune {
namespace {

// A kernel fault with SERVETUNE_GPU_SYNC_CHECK=1 is an error naming the op that faulted (block tables pointing far
// past the cache make the attention kernel read out of bounds). A fault ends the process's GPU context, so it runs in
// a child process (gtest's re-executing death-test style: CUDA cannot be used in a fork of a process that used it).
TEST(GpuFaults, SyncCheckNamesTheFaultingOp) {
  if (gpu_device_count() == 0) GTEST_SKIP() << "no GPU visible to the " << gpu_backend_name() << " runtime";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The child: an out-of-bounds attention under the sync check; its error goes to stderr, exit code 3.
  const auto child = [] {
    setenv("SERVETUNE_GPU_SYNC_CHECK", "1", 1);
    std::unique_ptr<Backend> gpu = make_backend(gpu_backend_name(), 1);
    const int64_t page = 16, n_kv = 1, head_dim = 64, n = 4;
    auto k = gpu->allocate(page * head_dim * 4), v = gpu->allocate(page * head_dim * 4);
    const std::vector<int32_t> positions = {0, 1, 2, 3}, seqs = {0, 0, 0, 0}, table = {1 << 28};
    auto upload = [&](const std::vector<int32_t>& h) {
      auto b = gpu->allocate(h.size() * 4);
      gpu->upload(*b, 0, h.data(), h.size() * 4);
      return b;
    };
    auto p = upload(positions), s = upload(seqs), t = upload(table);
    auto q = gpu->allocate(n * head_dim * 4), out = gpu->allocate(n * head_dim * 4);
    const KvLayerView kv{k->data(), v->data(), DType::kF32, 1, page, n_kv, head_dim};
    const AttentionBatch batch{n, static_cast<const int32_t*>(p->data()), static_cast<const int32_t*>(s->data()),
                               static_cast<const int32_t*>(t->data()), 1};
    try {
      gpu->attention(kv, batch, static_cast<const float*>(q->data()), 1, 0.125f, static_cast<float*>(out->data()));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::exit(3);
    }
    std::exit(0);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(3), "fault in op attention");
}

}  // namespace
}  // namespace servetune
