// The device-backend path of model loading and the forward pass, run on the CPU: a backend that delegates every op
// to the CPU backend but, like the GPU one, claims device memory (so index arrays are uploaded, logits rows gathered
// with embed, weights copied), keeps quantized weights as bf16 and draws dummy weights in place. Checks what the GPU
// build relies on without needing a GPU: identical logits for f32 models, bf16 logits close to the quantized ones,
// fused = eager, dummy weights generated through fill_random, draft-tree batches (their tree arrays uploaded with the
// other indices), mixture-of-experts layers routed on the "device" (the GPU's path, routing done by route_tokens), and
// decode graphs: the backend records the ops of a capture instead of running them and replays the
// recording, as CUDA graphs do.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/moe_routing.h"
#include "core/error.h"
#include "core/half.h"
#include "model/checkpoint.h"
#include "model/kv_storage.h"
#include "model/make_model.h"
#include "model_batches.h"
#include "test_paths.h"

namespace servetune {
namespace {

class DeviceStyleBackend final : public Backend {
 public:
  std::string name() const override { return "device-style cpu"; }
  bool host_memory() const override { return false; }
  bool supports_tree_attention() const override { return true; }
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
  std::unique_ptr<Buffer> allocate(size_t bytes) override {
    no_host_work_while_capturing();
    return cpu_.allocate(bytes);
  }
  void upload(Buffer& dst, size_t offset, const void* src, size_t bytes) override {
    no_host_work_while_capturing();
    ++uploads;
    cpu_.upload(dst, offset, src, bytes);
  }
  void download(void* dst, const Buffer& src, size_t offset, size_t bytes) override {
    no_host_work_while_capturing();
    cpu_.download(dst, src, offset, bytes);
  }
  void embed(const WeightMatrix& t, const int32_t* ids, int64_t n, float* out) override {
    run([=, this] { cpu_.embed(t, ids, n, out); });
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps) override {
    run([=, this] { cpu_.rms_norm(x, w, y, n, dim, eps); });
  }
  void matmul(const WeightMatrix& w, const float* bias, const float* x, int64_t n, float* y) override {
    run([=, this] { cpu_.matmul(w, bias, x, n, y); });
  }
  void rope(float* x, const int32_t* positions, int64_t n, int64_t n_heads, const RopeParams& p) override {
    run([=, this] { cpu_.rope(x, positions, n, n_heads, p); });
  }
  void store_kv(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t n) override {
    run([=, this] { cpu_.store_kv(kv, k, v, slots, n); });
  }
  void copy_kv_slots(const KvLayerView& kv, const int32_t* src, const int32_t* dst, int64_t n) override {
    run([=, this] { cpu_.copy_kv_slots(kv, src, dst, n); });
  }
  void attention(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, float scale, float* out) override {
    run([=, this] { cpu_.attention(kv, b, q, n_heads, scale, out); });
  }
  void silu_mul(const float* gate, const float* up, int64_t stride, int64_t n, int64_t ffn, float* out) override {
    run([=, this] { cpu_.silu_mul(gate, up, stride, n, ffn, out); });
  }
  void add(float* x, const float* y, int64_t n) override {
    run([=, this] { cpu_.add(x, y, n); });
  }
  void add_rms_norm(float* x, const float* r, const float* w, float* y, int64_t n, int64_t dim, float eps) override {
    run([=, this] { cpu_.add_rms_norm(x, r, w, y, n, dim, eps); });
  }
  void rope_store_qkv(const KvLayerView& kv, const float* qkv, const int32_t* positions, const int32_t* slots, int64_t n,
                      int64_t n_heads, const RopeParams& p, float* q_out) override {
    run([=, this] { cpu_.rope_store_qkv(kv, qkv, positions, slots, n, n_heads, p, q_out); });
  }
  void scatter_add_rows(const float* src, const int32_t* rows, const float* weights, int64_t n, int64_t width,
                        float* dst) override {
    run([=, this] { cpu_.scatter_add_rows(src, rows, weights, n, width, dst); });
  }
  void expert_mlps(std::span<const ExpertMlp> experts, const float* x, float* y) override {
    run([experts = std::vector<ExpertMlp>(experts.begin(), experts.end()), x, y, this] { cpu_.expert_mlps(experts, x, y); });
  }
  // Routing on the "device" (with device_routing): route_tokens and a stable sort by expert, as the GPU's kernels
  // compute them, so the model's moe_on_device path runs here.
  bool routes_on_device(const MoeRouting&) const override { return device_routing; }
  void group_by_expert(const MoeRouting& r, const float* logits, const float* bias, int64_t n, const int32_t* real_tokens,
                       int32_t* rows, float* weights, int32_t* offsets) override {
    run([=, this] {
      const int64_t count = n * r.top_k, grouped = real_tokens != nullptr ? *real_tokens * r.top_k : count;
      std::vector<int32_t> ids(static_cast<size_t>(count));
      std::vector<float> chosen(static_cast<size_t>(count));
      route_tokens(r, logits, bias, n, ids.data(), chosen.data());
      std::fill_n(offsets, r.n_experts + 1, 0);
      for (int64_t i = 0; i < grouped; ++i) ++offsets[ids[static_cast<size_t>(i)] + 1];
      for (int64_t e = 0; e < r.n_experts; ++e) offsets[e + 1] += offsets[e];
      std::vector<int32_t> next(offsets, offsets + r.n_experts);
      for (int64_t i = grouped; i < count; ++i) {  // a padded graph step's padding: in place, weight 0
        rows[i] = static_cast<int32_t>(i / r.top_k);
        weights[i] = 0.0f;
      }
      for (int64_t i = 0; i < grouped; ++i) {
        const int32_t at = next[static_cast<size_t>(ids[static_cast<size_t>(i)])]++;
        rows[at] = static_cast<int32_t>(i / r.top_k);
        weights[at] = chosen[static_cast<size_t>(i)];
      }
    });
    ++routings;
  }
  void expert_mlps_grouped(std::span<const ExpertWeights> experts, const int32_t* offsets, int64_t, const float* x,
                           float* y) override {
    run([experts = std::vector<ExpertWeights>(experts.begin(), experts.end()), offsets, x, y, this] {
      std::vector<ExpertMlp> runs;
      for (size_t e = 0; e < experts.size(); ++e) {
        runs.push_back({experts[e].gate, experts[e].up, experts[e].down, offsets[e], offsets[e + 1] - offsets[e]});
      }
      cpu_.expert_mlps(runs, x, y);
    });
  }
  void head_matmul(const WeightMatrix& w, int64_t n_heads, const float* x, HeadStrides xs, int64_t n, float* y,
                   HeadStrides ys) override {
    run([=, this] { cpu_.head_matmul(w, n_heads, x, xs, n, y, ys); });
  }
  void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t n, int64_t width) override {
    run([=, this] { cpu_.copy_rows(src, src_stride, dst, dst_stride, n, width); });
  }
  void store_latent(const KvLayerView& kv, const float* latent, int64_t latent_width, const float* rope_key,
                    const int32_t* slots, int64_t n) override {
    run([=, this] { cpu_.store_latent(kv, latent, latent_width, rope_key, slots, n); });
  }
  void attention_latent(const KvLayerView& kv, const AttentionBatch& b, const float* q, int64_t n_heads, int64_t v_dim,
                        float scale, float* out) override {
    run([=, this] { cpu_.attention_latent(kv, b, q, n_heads, v_dim, scale, out); });
  }

  // Graphs as CUDA has them: a capture records the ops without running them; a replay runs the recording.
  bool begin_capture() override {
    if (!graphs_enabled) return false;
    capturing_ = true;
    recording_.clear();
    return true;
  }
  void end_capture(int64_t key) override {
    capturing_ = false;
    if (key >= 0) graphs_[key] = std::move(recording_);
    ++captures;
  }
  void replay_graph(int64_t key) override {
    for (auto& op : graphs_.at(key)) op();
    ++replays;
  }
  void drop_graphs() override { graphs_.clear(); }

  int fills = 0;
  int uploads = 0;
  bool device_routing = false;
  int routings = 0;
  bool graphs_enabled = false;
  int captures = 0;
  int replays = 0;

 private:
  void run(std::function<void()> op) {
    if (capturing_) recording_.push_back(std::move(op));
    else op();
  }
  void no_host_work_while_capturing() const {
    if (capturing_) throw std::logic_error("host work (allocate / upload / download) inside a graph capture");
  }

  cpu::CpuBackend cpu_{2};
  bool capturing_ = false;
  std::vector<std::function<void()>> recording_;
  std::map<int64_t, std::vector<std::function<void()>>> graphs_;
};

// Logits of every position of one prompt in two chunks (the second continues the cached first).
std::vector<float> prompt_logits(const Checkpoint& ck, Backend& backend, bool fused, const std::vector<int32_t>& tokens) {
  auto model = ck.load(backend, ParallelContext{}, CompileOptions{fused, 0});
  const int64_t page = 4, blocks = 16;
  KvStorage kv(backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
  std::vector<float> all, logits;
  const int n = static_cast<int>(tokens.size()), half = n / 2;
  for (auto [begin, end] : {std::pair<int, int>{0, half}, {half, n}}) {
    model->forward(testing::one_sequence(tokens, begin, end, page, blocks), kv, logits);
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

// The mixture-of-experts and latent-attention families' device path (indices and the sorted expert assignments
// uploaded, router logits downloaded for host routing, MLA's absorbed weights derived through a host loader): the
// CPU's logits exactly for f32 models, and within bf16's error for the FP8 checkpoint (bf16 on a device).
TEST(DeviceStyleLoading, MoeAndMlaModelsGiveTheCpuLogits) {
  for (const std::string name : {"deepseek_v3_tiny", "deepseek_v2_lite_tiny", "mixtral_tiny", "qwen3_moe_tiny",
                                 "deepseek_v3_tiny_fp8"}) {
    Checkpoint ck(testing::data_path("hf_models/" + name), LoadFormat::kSafetensors);
    auto cpu = make_backend("cpu", 2);
    const std::vector<int32_t> prompt = {1, 203, 207, 61, 178, 232, 183, 86, 61, 176, 298, 315, 21};
    for (bool fused : {false, true}) {
      const auto expected = prompt_logits(ck, *cpu, fused, prompt);
      DeviceStyleBackend device;
      const auto got = prompt_logits(ck, device, fused, prompt);
      if (!name.ends_with("fp8")) {
        EXPECT_EQ(got, expected) << name << " fused " << fused;
        continue;
      }
      ASSERT_EQ(got.size(), expected.size());
      double diff = 0.0, scale = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - expected[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(expected[i])));
      }
      EXPECT_LT(diff / scale, 0.05) << name << " fused " << fused;
    }
  }
}

// Routing on the device (the GPU's moe_on_device path: group_by_expert, expert_mlps_grouped, the per-layer runs kept on
// the device and counted once per forward): the CPU's logits bit for bit, and the same expert load counters.
TEST(DeviceStyleLoading, MoeRoutedOnTheDeviceGivesTheCpuLogitsAndLoad) {
  for (const std::string name : {"deepseek_v3_tiny", "deepseek_v2_lite_tiny", "mixtral_tiny", "qwen3_moe_tiny"}) {
    Checkpoint ck(testing::data_path("hf_models/" + name), LoadFormat::kSafetensors);
    const std::vector<int32_t> prompt = {1, 203, 207, 61, 178, 232, 183, 86, 61, 176, 298, 315, 21};
    auto cpu = make_backend("cpu", 2);
    DeviceStyleBackend device;
    device.device_routing = true;
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<std::vector<int64_t>>> load;
    for (Backend* backend : {cpu.get(), static_cast<Backend*>(&device)}) {
      auto model = ck.load(*backend, ParallelContext{}, CompileOptions{true, 0});
      KvStorage kv(*backend, model->config(), model->local_kv_heads(), 16, 4, DType::kF32);
      std::vector<float> all, step;
      const int n = static_cast<int>(prompt.size());
      for (auto [begin, end] : {std::pair<int, int>{0, n / 2}, {n / 2, n}}) {
        model->forward(testing::one_sequence(prompt, begin, end, 4, 16), kv, step);
        all.insert(all.end(), step.begin(), step.end());
      }
      logits.push_back(all);
      load.push_back(model->expert_distribution());
    }
    EXPECT_GT(device.routings, 0) << name << ": the model routed on the host";
    EXPECT_EQ(logits[1], logits[0]) << name;
    EXPECT_EQ(load[1], load[0]) << name;
    EXPECT_FALSE(load[0].empty()) << name;
  }
}

// Logits of a draft tree verified after `context` cached positions of `tokens`: a root, two children, a grandchild
// under the second child, and a great-grandchild (nodes at cache indices context + i, positions by depth).
std::vector<float> tree_logits(const Checkpoint& ck, Backend& backend, const std::vector<int32_t>& tokens) {
  auto model = ck.load(backend, ParallelContext{}, CompileOptions{false, 0});
  const int64_t page = 4, blocks = 16;
  const int context = 7;
  KvStorage kv(backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
  std::vector<float> logits;
  model->forward(testing::one_sequence(tokens, 0, context, page, blocks), kv, logits);
  const std::vector<int> parents = {-1, 0, 0, 2, 3};
  const auto nodes = static_cast<int>(parents.size());
  Batch b = testing::one_sequence(tokens, context, context + nodes, page, blocks);
  std::vector<int> depth(parents.size(), 0);
  for (int i = 0; i < nodes; ++i) {
    const int parent = parents[static_cast<size_t>(i)];
    depth[static_cast<size_t>(i)] = parent < 0 ? 0 : depth[static_cast<size_t>(parent)] + 1;
    b.positions[static_cast<size_t>(i)] = context + depth[static_cast<size_t>(i)];
    b.tree_base.push_back(context);
    b.tree_mask.push_back((uint64_t{1} << i) | (parent < 0 ? 0 : b.tree_mask[static_cast<size_t>(parent)]));
  }
  model->forward(b, kv, logits);
  return logits;
}

TEST(DeviceStyleLoading, DraftTreeBatchesGiveTheCpuLogits) {
  for (const std::string name : {"", "deepseek_v3_tiny"}) {  // llama (stories260K), then MLA
    const Checkpoint ck = name.empty() ? Checkpoint(testing::stories_path(), LoadFormat::kGguf)
                                       : Checkpoint(testing::data_path("hf_models/" + name), LoadFormat::kSafetensors);
    const std::vector<int32_t>& prompt = name.empty() ? kPrompt : std::vector<int32_t>{1, 203, 207, 61, 178, 232, 183, 86, 61, 176, 298, 315, 21};
    auto cpu = make_backend("cpu", 2);
    const auto expected = tree_logits(ck, *cpu, prompt);
    DeviceStyleBackend device;
    EXPECT_EQ(tree_logits(ck, device, prompt), expected) << (name.empty() ? "stories260K" : name);
  }
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
  // Nothing but the vectors (RMSNorm weights: two per layer and the output norm, bf16) was generated on the host: a
  // matrix drawn there too would cost an 8B model's load minutes and gigabytes of host memory.
  EXPECT_EQ(ck.dummy_host_bytes(), (2 * ck.config().n_layers + 1) * ck.config().hidden * 2);
  std::filesystem::remove_all(dir);
}

// Three sequences prefilled together, then greedy decode steps of all three, then of the first two (another bucket):
// every step's logits, the decode steps' going through padded graphs when the model has them.
std::vector<std::vector<float>> decode_steps(Model& model, Backend& backend) {
  const int64_t page = 4, per_seq = 8;
  KvStorage kv(backend, model.config(), model.local_kv_heads(), 3 * per_seq, page, DType::kF32);
  const int64_t vocab = model.config().vocab;
  std::vector<std::vector<int32_t>> seqs = {{1, 403, 407}, {1, 261}, {1, 378, 432, 383, 286}};
  for (auto& seq : seqs) {
    for (int32_t& id : seq) id = static_cast<int32_t>(id % vocab);  // the tiny MoE models' vocabularies are smaller
  }
  std::vector<std::vector<float>> all;
  auto step = [&](size_t n_seqs, bool prefill) {
    Batch b;
    b.max_blocks_per_seq = per_seq;
    for (size_t s = 0; s < n_seqs; ++s) {
      const auto len = static_cast<int32_t>(seqs[s].size());
      for (int32_t p = prefill ? 0 : len - 1; p < len; ++p) {
        b.tokens.push_back(seqs[s][static_cast<size_t>(p)]);
        b.positions.push_back(p);
        b.seq_of_token.push_back(static_cast<int32_t>(s));
        b.slot_mapping.push_back(static_cast<int32_t>((static_cast<int64_t>(s) * per_seq + p / page) * page + p % page));
      }
      b.logits_indices.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      for (int64_t i = 0; i < per_seq; ++i) b.block_tables.push_back(static_cast<int32_t>(static_cast<int64_t>(s) * per_seq + i));
    }
    std::vector<float> logits;
    model.forward(b, kv, logits);
    for (size_t s = 0; s < n_seqs; ++s) {
      const auto row = logits.begin() + static_cast<int64_t>(s) * vocab;
      seqs[s].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    all.push_back(logits);
  };
  step(3, true);
  for (int i = 0; i < 4; ++i) step(3, false);
  for (int i = 0; i < 4; ++i) step(2, false);
  return all;
}

// Each step's logits within 1e-5 of the largest expected one (graph steps run padded batches: other kernel shapes).
void expect_steps_close(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), expected[i].size()) << "step " << i;
    double diff = 0.0, scale = 0.0;
    for (size_t k = 0; k < got[i].size(); ++k) {
      diff = std::max(diff, std::fabs(static_cast<double>(got[i][k]) - expected[i][k]));
      scale = std::max(scale, std::fabs(static_cast<double>(expected[i][k])));
    }
    EXPECT_LT(diff / scale, 1e-5) << "step " << i;
  }
}

// decode_steps eagerly (compile fused when `fused_eager`, else eager) and through graphs of up to 8 sequences, each on
// its own device-style backend (experts routed on the "device" when `device_routing`): the logits agree, and buckets 4
// (three sequences) and 2 each ran once eagerly, were captured once, then replayed. Returns the two models' expert
// load counters (eager, graphs).
std::pair<std::vector<std::vector<int64_t>>, std::vector<std::vector<int64_t>>> expect_graph_steps_match(
    const Checkpoint& ck, bool fused_eager, bool device_routing) {
  DeviceStyleBackend eager_backend;
  eager_backend.device_routing = device_routing;
  auto eager = ck.load(eager_backend, ParallelContext{}, CompileOptions{fused_eager, 0});
  const auto expected = decode_steps(*eager, eager_backend);
  DeviceStyleBackend graph_backend;
  graph_backend.device_routing = device_routing;
  graph_backend.graphs_enabled = true;
  auto graphs = ck.load(graph_backend, ParallelContext{}, CompileOptions{true, 8});
  expect_steps_close(decode_steps(*graphs, graph_backend), expected);
  EXPECT_EQ(graph_backend.captures, 2);
  EXPECT_EQ(graph_backend.replays, 6);
  return {eager->expert_distribution(), graphs->expert_distribution()};
}

TEST(DeviceStyleLoading, DecodeGraphsReplayTheEagerSteps) {
  expect_graph_steps_match(Checkpoint(testing::stories_path(), LoadFormat::kGguf), false, false);
}

// Mixture-of-experts and latent-attention decode steps through graphs (experts routed on the "device", padding tokens
// left out of the grouping): the fused eager steps' logits and the same expert load counters; without device
// routing, compile = graphs is refused naming it.
TEST(DeviceStyleLoading, MoeDecodeGraphsReplayTheEagerSteps) {
  for (const std::string name : {"deepseek_v3_tiny", "deepseek_v2_lite_tiny", "mixtral_tiny", "qwen3_moe_tiny"}) {
    SCOPED_TRACE(name);
    Checkpoint ck(testing::data_path("hf_models/" + name), LoadFormat::kSafetensors);
    const auto [eager_load, graph_load] = expect_graph_steps_match(ck, true, true);
    EXPECT_EQ(graph_load, eager_load) << "padding tokens counted as routed";
    EXPECT_FALSE(eager_load.empty());

    DeviceStyleBackend host_routing;
    try {
      ck.load(host_routing, ParallelContext{}, CompileOptions{true, 8});
      ADD_FAILURE() << "compile = graphs was accepted with the experts routed on the host";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("routed on the device"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace servetune
