// The device-backend path of model loading and the forward pass, run on the CPU: a backend that delegates every op
// to the CPU backend but, like the GPU one, claims device memory (so index arrays are uploaded, logits rows gathered
// with embed, weights copied), keeps quantized weights as bf16 and draws dummy weights in place. Checks what the GPU
// build relies on without needing a GPU: identical logits for f32 models, bf16 logits close to the quantized ones,
// fused = eager, and dummy weights generated through fill_random.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/half.h"
#include "model/checkpoint.h"
#include "model/kv_storage.h"
#include "model/make_model.h"
#include "test_paths.h"

namespace servetune {
namespace {

class DeviceStyleBackend final : public Backend {
 public:
  std::string name() const override { return "device-style cpu"; }
  bool host_memory() const override { return false; }
  DType matrix_storage_type(DType t) const override { return t == DType::kF32 || t == DType::kBF16 ? t : DType::kBF16; }
  bool fill_random(void* dst, DType type, int64_t n, uint64_t seed, float mean, float std) override {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(mean, std);
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      if (type == DType::kBF16) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v);
      else static_cast<float*>(dst)[i] = v;
    }
    ++fills;
    return true;
  }
  std::unique_ptr<Buffer> allocate(size_t bytes) override { return cpu_.allocate(bytes); }
  void upload(Buffer& dst, size_t offset, const void* src, size_t bytes) override {
    ++uploads;
    cpu_.upload(dst, offset, src, bytes);
  }
  void download(void* dst, const Buffer& src, size_t offset, size_t bytes) override { cpu_.download(dst, src, offset, bytes); }
  void embed(const WeightMatrix& t, const int32_t* ids, int64_t n, float* out) override { cpu_.embed(t, ids, n, out); }
  void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) override {
    cpu_.rms_norm(x, w, y, n, dim, eps);
  }
  void matmul(const WeightMatrix& w, const float* bias, const float* x, int64_t n, float* y) override {
    cpu_.matmul(w, bias, x, n, y);
  }
  void rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) override {
    cpu_.rope(x, positions, n, n_heads, p);
  }
  void store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n) override {
    cpu_.store_kv(kv, k, v, slots, n);
  }
  void attention(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, float scale, float* out) override {
    cpu_.attention(kv, b, q, n_heads, scale, out);
  }
  void silu_mul(const float* gate, const float* up, int64_t stride, int64_t n, int64_t ffn, float* out) override {
    cpu_.silu_mul(gate, up, stride, n, ffn, out);
  }
  void add(float* x, const float* y, int64_t n) override { cpu_.add(x, y, n); }
  void add_rms_norm(float* x, const float* r, const float* w, float* y, int64_t n, int64_t dim, float eps) override {
    cpu_.add_rms_norm(x, r, w, y, n, dim, eps);
  }
  void rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots, int64_t n,
                      int64_t n_heads, const RopeParams& p, float* q_out) override {
    cpu_.rope_store_qkv(kv, qkv, positions, slots, n, n_heads, p, q_out);
  }

  int fills = 0;
  int uploads = 0;

 private:
  cpu::CpuBackend cpu_{2};
};

// Logits of every position of one prompt in two chunks (the second continues the cached first).
std::vector<float> prompt_logits(const Checkpoint& ck, Backend& backend, bool fused, const std::vector<int32_t>& tokens) {
  auto model = ck.load(backend, ParallelContext{}, fused);
  const int64_t page = 4, blocks = 16;
  KvStorage kv(backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
  std::vector<float> all, logits;
  const int n = static_cast<int>(tokens.size()), half = n / 2;
  for (auto [begin, end] : {std::pair<int, int>{0, half}, {half, n}}) {
    Batch b;
    for (int p = begin; p < end; ++p) {
      b.tokens.push_back(tokens[static_cast<size_t>(p)]);
      b.positions.push_back(p);
      b.seq_of_token.push_back(0);
      b.slot_mapping.push_back(static_cast<int32_t>((blocks - 1 - p / page) * page + p % page));  // blocks in reverse
      b.logits_indices.push_back(end - 1 - p);  // rows out of order
    }
    b.max_blocks_per_seq = blocks;
    for (int64_t i = 0; i < blocks; ++i) b.block_tables.push_back(static_cast<int32_t>(blocks - 1 - i));
    model->forward(b, kv, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421};

TEST(DeviceStyleLoading, F32ModelGivesTheCpuLogitsEagerAndFused) {
  Checkpoint ck(testing::stories_path(), LoadFormat::kGguf);
  auto cpu = make_backend("cpu", 2);
  const auto expected = prompt_logits(ck, *cpu, false, kPrompt);
  DeviceStyleBackend device;
  EXPECT_EQ(prompt_logits(ck, device, false, kPrompt), expected);
  EXPECT_GT(device.uploads, 0) << "weights and batch indices go through upload";
  EXPECT_EQ(prompt_logits(ck, device, true, kPrompt), expected);
}

TEST(DeviceStyleLoading, QuantizedModelAsBf16StaysCloseToTheQuantizedLogits) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  Checkpoint ck(testing::smollm2_path(), LoadFormat::kGguf);
  auto cpu = make_backend("cpu", 2);
  const std::vector<int32_t> prompt = {1, 504, 3458, 282, 4649, 314, 253, 1345, 28, 346, 253, 9773, 30};
  const auto expected = prompt_logits(ck, *cpu, false, prompt);
  DeviceStyleBackend device;
  const auto ours = prompt_logits(ck, device, true, prompt);
  ASSERT_EQ(ours.size(), expected.size());
  const size_t vocab = static_cast<size_t>(ck.config().vocab);
  for (size_t r = 0; r < expected.size() / vocab; ++r) {
    double diff = 0.0, scale = 0.0;
    size_t arg_ours = 0, arg_expected = 0;
    for (size_t i = 0; i < vocab; ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(ours[r * vocab + i]) - expected[r * vocab + i]));
      scale = std::max(scale, std::fabs(static_cast<double>(expected[r * vocab + i])));
      if (ours[r * vocab + i] > ours[r * vocab + arg_ours]) arg_ours = i;
      if (expected[r * vocab + i] > expected[r * vocab + arg_expected]) arg_expected = i;
    }
    // bf16 weights vs Q4_1 weights with q8 activations (the CPU path), through 30 layers: a few percent apart.
    EXPECT_LT(diff / scale, 0.1) << "row " << r;
    EXPECT_EQ(arg_ours, arg_expected) << "row " << r;
  }
}

TEST(DeviceStyleLoading, DummyWeightsAreDrawnInPlace) {
  const auto dir = std::filesystem::temp_directory_path() / ("servetune_device_dummy_" + std::to_string(::getpid()));
  write_random_model(model_preset("tiny-gqa"), dir.string(), 3, DType::kBF16, 0.02f);
  Checkpoint ck(dir.string(), LoadFormat::kDummy, 5);
  for (bool fused : {false, true}) {
    DeviceStyleBackend device;
    const auto logits = prompt_logits(ck, device, fused, {1, 5, 9, 200, 17, 4});
    const int64_t layers = ck.config().n_layers;
    // Every matrix (embedding, output head; q, k, v, o, gate, up, down per layer, stacked ones as their parts) is
    // drawn in place.
    EXPECT_EQ(device.fills, 2 + 7 * layers) << "fused " << fused;
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace servetune
