// The CUDA backend's FP8 GEMM (block-scaled e4m3 weights through cuBLASLt, activations quantized per token and 128
// columns on the device) against the CPU backend's block-scaled FP8 matmul, on DeepSeek-V3's shapes and on small
// shapes with partial 128-blocks, at 1, 16 and 300 tokens (1 and 301: the padded-token path), with a bias, into an
// unaligned output, and replayed from a captured graph; FP8 experts through expert_mlps (the grouped kernel, and one
// GEMM per expert). Skips without a GPU, and on GPUs where the backend keeps FP8 weights as bf16 (anything but sm_90,
// the HIP build, SERVETUNE_GPU_GEMM=tiled).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/fp8_layout.h"
#include "core/half.h"
#include "gpu_test_support.h"

namespace servetune {
namespace {

using gpu_test::GpuFixture;

// A [rows, cols] block-scaled FP8 matrix: codes of normal values (saturated tails included) and one scale per
// 128x128 block, different per block, packed as the loader packs them (fp8_scale_stride).
struct Fp8Weights {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;

  WeightMatrix view(const void* data, const float* scale_data) const {
    return {data, DType::kFP8_E4M3_B128, rows, cols, cols, BlockScales{scale_data, fp8_scale_stride(cols), 0}};
  }
};

Fp8Weights make_weights(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  std::uniform_real_distribution<float> uniform(0.5f, 2.0f);
  Fp8Weights w{rows, cols, std::vector<uint8_t>(static_cast<size_t>(rows * cols)), {}};
  for (auto& c : w.codes) c = f32_to_fp8_e4m3(normal(rng));
  std::vector<float> grid(static_cast<size_t>(fp8_blocks(rows) * fp8_blocks(cols)));
  for (auto& s : grid) s = uniform(rng) * 1e-3f;
  w.scales = pack_block_scales(BlockScales{grid.data(), fp8_blocks(cols), 0}, rows, cols);
  return w;
}

// Activations whose tokens differ in magnitude by up to 2^6, so per-token group scales matter.
std::vector<float> make_activations(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (int64_t t = 0; t < n; ++t) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(t % 7) - 3);
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(t * cols + c)] = normal(rng) * magnitude;
  }
  return x;
}

// The activations as the GPU sees them: quantized per token and 128 columns (fp8_layout.h's host reference), back to f32.
std::vector<float> quantized(const std::vector<float>& x, int64_t n, int64_t cols) {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  quantize_fp8_groups(x.data(), n, cols, codes, scales);
  const int64_t n_pad = fp8_gemm_tokens(n);
  std::vector<float> out(static_cast<size_t>(n * cols));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < cols; ++c)
      out[static_cast<size_t>(t * cols + c)] =
          fp8_e4m3_to_f32(codes[static_cast<size_t>(t * cols + c)]) * scales[static_cast<size_t>(c / 128 * n_pad + t)];
  return out;
}

double rms(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(std::max<size_t>(v.size(), 1)));
}

// Largest and root-mean-square |a - b| over rms(b).
std::pair<double, double> errors(const std::vector<float>& a, const std::vector<float>& b) {
  double largest = 0.0, sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    largest = std::max(largest, d);
    sum += d * d;
  }
  const double scale = std::max(rms(b), 1e-30);
  return {largest / scale, std::sqrt(sum / static_cast<double>(std::max<size_t>(a.size(), 1))) / scale};
}

class GpuFp8 : public GpuFixture {
 protected:
  void SetUp() override {
    GpuFixture::SetUp();
    if (IsSkipped()) return;
    if (gpu_->matrix_storage_type(DType::kFP8_E4M3_B128) != DType::kFP8_E4M3_B128) {
      GTEST_SKIP() << "this GPU backend keeps FP8 weights as bf16 (the FP8 GEMM needs an sm_90 CUDA device and "
                      "cuBLAS, not SERVETUNE_GPU_GEMM=tiled)";
    }
  }

  // GPU FP8 matmul of `w` against the CPU's FP8 matmul, for each token count:
  // - against the CPU on the activations the GPU multiplies (quantized as fp8_layout.h says): the same products of
  //   e4m3 values, exact in f32, summed in another order. Hopper's FP8 tensor cores keep about 14 mantissa bits while
  //   accumulating within a 128-column block (DeepSeek-V3 report, section 3.3.2); cuBLAS adds the scaled block sums in
  //   f32. With K columns that bounds the error by about 2^-14 * sum |w x|, and sum |w x| is about 0.64 sqrt(K) rms(y)
  //   for independent terms: 3e-3 rms(y) at K = 7168. 1e-2 rms(y) leaves margin; a misread scale or layout is O(1).
  // - against the CPU on the unquantized activations (what the CPU engine computes): e4m3 rounds each activation by
  //   at most 2^-4 of itself (about 2^-4 / sqrt(3) RMS), independently per term, so the result's RMS error is at
  //   most ~3.6% of rms(y); 6% RMS and 40% at the worst element (many sigma over 2M outputs).
  void check(const Fp8Weights& w, const std::vector<int64_t>& token_counts, bool bias = false) {
    const WeightMatrix host_w = w.view(w.codes.data(), w.scales.data());
    const WeightMatrix dev_w = w.view(dev(w.codes), dev(w.scales));
    cpu::CpuBackend cpu(8);
    const std::vector<float> b = gpu_test::random_floats(static_cast<size_t>(w.rows), 3);
    for (int64_t n : token_counts) {
      const std::vector<float> x = make_activations(n, w.cols, static_cast<uint32_t>(n));
      const size_t outputs = static_cast<size_t>(n * w.rows);
      std::vector<float> exact(outputs), same_inputs(outputs);
      cpu.matmul(host_w, bias ? b.data() : nullptr, x.data(), n, exact.data());
      const std::vector<float> xq = quantized(x, n, w.cols);
      cpu.matmul(host_w, bias ? b.data() : nullptr, xq.data(), n, same_inputs.data());
      // The output one float into its buffer: never 256-byte aligned, so the result goes through the scratch copy.
      float* y = dev(std::vector<float>(outputs + 1, 0.0f));
      gpu_->matmul(dev_w, bias ? dev(b) : nullptr, dev(x), n, y + 1);
      const std::vector<float> got_all = host(y, outputs + 1);
      const std::vector<float> got(got_all.begin() + 1, got_all.end());
      EXPECT_EQ(got_all[0], 0.0f) << "wrote before its output";
      const auto [q_max, q_rms] = errors(got, same_inputs);
      EXPECT_LT(q_max, 1e-2) << w.rows << "x" << w.cols << " n " << n << ": against the same quantized activations";
      const auto [e_max, e_rms] = errors(got, exact);
      EXPECT_LT(e_rms, 0.06) << w.rows << "x" << w.cols << " n " << n << ": against f32 activations (RMS)";
      EXPECT_LT(e_max, 0.4) << w.rows << "x" << w.cols << " n " << n << ": against f32 activations (worst element)";
      // Straight into an aligned output (n a multiple of 4: no padding) gives the same values.
      if (n % 4 == 0) {
        float* aligned = dev(std::vector<float>(outputs, 0.0f));
        gpu_->matmul(dev_w, bias ? dev(b) : nullptr, dev(x), n, aligned);
        EXPECT_EQ(host(aligned, outputs), got) << w.rows << "x" << w.cols << " n " << n << ": aligned output";
      }
    }
  }
};

TEST_F(GpuFp8, DeepSeekV3Shapes) {
  // MoE expert up/gate (2048 x 7168), expert down (7168 x 2048), kv_a_proj_with_mqa (576 x 7168: a partial row block).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{2048, 7168}, {7168, 2048}, {576, 7168}}) {
    check(make_weights(rows, cols, static_cast<uint32_t>(rows + cols)), {1, 16, 300});
  }
}

TEST_F(GpuFp8, PartialBlocksPaddedTokensAndBias) {
  // Partial 128-blocks in both dimensions (the test checkpoints' shapes: deepseek_v3_tiny_fp8's 64-column rows,
  // deepseek_v3_small_fp8's 320), token counts not multiples of 4.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{40, 64}, {96, 32}, {192, 320}, {320, 160}}) {
    check(make_weights(rows, cols, static_cast<uint32_t>(rows * cols)), {1, 3, 5, 301}, true);
  }
}

TEST_F(GpuFp8, GraphReplayMatchesTheEagerCall) {
  const Fp8Weights w = make_weights(256, 512, 11);
  const WeightMatrix dev_w = w.view(dev(w.codes), dev(w.scales));
  for (int64_t n : {1, 8}) {
    const std::vector<float> x = make_activations(n, w.cols, 12);
    const float* x_dev = dev(x);
    float* eager = dev(std::vector<float>(static_cast<size_t>(n * w.rows), 0.0f));
    float* replayed = dev(std::vector<float>(static_cast<size_t>(n * w.rows), 0.0f));
    gpu_->matmul(dev_w, nullptr, x_dev, n, eager);  // the eager call sizes the scratch the capture then uses
    ASSERT_TRUE(gpu_->begin_capture());
    gpu_->matmul(dev_w, nullptr, x_dev, n, replayed);
    gpu_->end_capture(n);
    gpu_->replay_graph(n);
    gpu_->synchronize();
    EXPECT_EQ(host(replayed, static_cast<size_t>(n * w.rows)), host(eager, static_cast<size_t>(n * w.rows))) << "n " << n;
  }
  gpu_->drop_graphs();
}

// expert_mlps with FP8 experts against the CPU's (f32 activations, exact dequantization): the grouped kernel rounds
// activations and dequantized weights to bf16 (each product off by about 2^-8 of itself, independently: well under
// 1% RMS of the output after both projections); one cuBLASLt FP8 GEMM per expert (SERVETUNE_GPU_MOE=loop) quantizes
// activations to e4m3 before both projections (check()'s 6% RMS bound for one; 10% for the two). DeepSeek-V3's
// expert shape with decode-like counts (16-row tiles) and prefill-like ones (64-row tiles), and a shape with partial
// 128-blocks.
TEST_F(GpuFp8, ExpertMlpsGroupedAndPerExpert) {
  struct Case {
    int64_t hidden, ffn;
    std::vector<int64_t> counts;
  };
  for (const Case& c : {Case{7168, 2048, {3, 0, 5}}, Case{7168, 2048, {70, 64}}, Case{320, 192, {1, 66, 2}}}) {
    std::vector<Fp8Weights> host_w;
    for (size_t e = 0; e < c.counts.size(); ++e) {
      const auto seed = static_cast<uint32_t>(100 + 3 * e);
      host_w.push_back(make_weights(c.ffn, c.hidden, seed));
      host_w.push_back(make_weights(c.ffn, c.hidden, seed + 1));
      host_w.push_back(make_weights(c.hidden, c.ffn, seed + 2));
    }
    std::vector<WeightMatrix> on_host, on_device;
    for (const Fp8Weights& w : host_w) {
      on_host.push_back(w.view(w.codes.data(), w.scales.data()));
      on_device.push_back(w.view(dev(w.codes), dev(w.scales)));
    }
    std::vector<Backend::ExpertMlp> cpu_experts, gpu_experts;
    int64_t n = 0;
    for (size_t e = 0; e < c.counts.size(); ++e) {
      cpu_experts.push_back({&on_host[3 * e], &on_host[3 * e + 1], &on_host[3 * e + 2], n, c.counts[e]});
      gpu_experts.push_back({&on_device[3 * e], &on_device[3 * e + 1], &on_device[3 * e + 2], n, c.counts[e]});
      n += c.counts[e];
    }
    const std::vector<float> x = make_activations(n, c.hidden, 7);
    cpu::CpuBackend cpu(8);
    std::vector<float> expected(static_cast<size_t>(n * c.hidden));
    cpu.expert_mlps(cpu_experts, x.data(), expected.data());
    for (const bool loop : {false, true}) {
      if (loop) setenv("SERVETUNE_GPU_MOE", "loop", 1);
      std::unique_ptr<Backend> backend = make_backend(gpu_backend_name(), 1);
      unsetenv("SERVETUNE_GPU_MOE");
      float* y = dev(std::vector<float>(expected.size(), 0.0f));
      gpu_->synchronize();  // the uploads ran on the fixture's stream
      backend->expert_mlps(gpu_experts, dev(x), y);
      backend->synchronize();
      const auto [e_max, e_rms] = errors(host(y, expected.size()), expected);
      const std::string what = std::to_string(c.hidden) + "x" + std::to_string(c.ffn) + " rows " + std::to_string(n) +
                               (loop ? " per expert" : " grouped");
      EXPECT_LT(e_rms, loop ? 0.1 : 0.01) << what << " (RMS)";
      EXPECT_LT(e_max, loop ? 0.6 : 0.1) << what << " (worst element)";
    }
  }
}

TEST_F(GpuFp8, TiledGemmBackendKeepsFp8AsBf16) {
  setenv("SERVETUNE_GPU_GEMM", "tiled", 1);
  std::unique_ptr<Backend> tiled = make_backend(gpu_backend_name(), 1);
  unsetenv("SERVETUNE_GPU_GEMM");
  EXPECT_EQ(tiled->matrix_storage_type(DType::kFP8_E4M3_B128), DType::kBF16);
}

}  // namespace
}  // namespace servetune
