// Loading block-scaled FP8 weights (F8_E4M3 codes + F32 weight_scale_inv, DeepSeek-V3's layout) from a safetensors
// checkpoint written here: the loader finds each weight's scales under its HF name, checks their shape, keeps the codes
// as they are with the scales beside them on the CPU (row slices starting mid-block included; column slices only on
// 128-column blocks), keeps FP8 matrices out of stacked ones there, and dequantizes them to bf16 for a device backend.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/fp8_layout.h"
#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"
#include "formats/safetensors.h"
#include "model/hf_weights.h"
#include "model/parallel.h"
#include "model/weight_loader.h"

namespace servetune {
namespace {

namespace fs = std::filesystem;

// One FP8 weight with its scale grid as written to the file, and the matrix it stands for.
struct Fp8Tensor {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // [ceil(rows / 128), ceil(cols / 128)]
  std::vector<float> dequant;

  int64_t block_cols() const { return (cols + 127) / 128; }
  float value(int64_t r, int64_t c) const { return dequant[static_cast<size_t>(r * cols + c)]; }
};

Fp8Tensor make_fp8(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 60.0f);
  std::uniform_real_distribution<float> uniform(1e-4f, 1e-2f);
  Fp8Tensor t;
  t.rows = rows;
  t.cols = cols;
  t.codes.resize(static_cast<size_t>(rows * cols));
  for (uint8_t& code : t.codes) code = f32_to_fp8_e4m3(normal(rng));
  t.scales.resize(static_cast<size_t>((rows + 127) / 128 * t.block_cols()));
  for (float& s : t.scales) s = uniform(rng);
  t.dequant.resize(t.codes.size());
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_fp8_block_row(t.codes.data() + r * cols, t.scales.data() + r / 128 * t.block_cols(),
                             t.dequant.data() + r * cols, cols);
  }
  return t;
}

std::span<const uint8_t> bytes_of(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

// A backend like the GPU ones as far as loading goes: device memory (no host views), bf16 for every matrix type but
// f32 and bf16, or with keep_fp8 as CUDA on sm_90: block-scaled FP8 kept in the shapes its FP8 GEMM takes
// (fp8_gemm_shape_problem). Its memory is host memory, so the test can read what was uploaded. No ops.
class Bf16DeviceBackend final : public Backend {
 public:
  explicit Bf16DeviceBackend(bool keep_fp8 = false) : keep_fp8_(keep_fp8) {}
  std::string name() const override { return "bf16 device"; }
  bool host_memory() const override { return false; }
  DType matrix_storage_type(DType t) const override {
    if (keep_fp8_ && t == DType::kFP8_E4M3_B128) return t;
    return t == DType::kF32 || t == DType::kBF16 ? t : DType::kBF16;
  }
  bool keeps_block_scaled(int64_t rows, int64_t cols, int64_t row_offset) const override {
    return fp8_gemm_shape_problem(rows, cols, row_offset).empty();
  }
  std::unique_ptr<Buffer> allocate(size_t bytes) override { return cpu_.allocate(bytes); }
  void upload(Buffer& dst, size_t offset, const void* src, size_t bytes) override { cpu_.upload(dst, offset, src, bytes); }
  void download(void* dst, const Buffer& src, size_t offset, size_t bytes) override { cpu_.download(dst, src, offset, bytes); }
  void embed(const WeightMatrix&, const int32_t*, int64_t, float*) override { no_ops(); }
  void rms_norm(const float*, const float*, float*, int64_t, int64_t, float) override { no_ops(); }
  void matmul(const WeightMatrix&, const float*, const float*, int64_t, float*) override { no_ops(); }
  void rope(float*, const int32_t*, int64_t, int64_t, const RopeParams&) override { no_ops(); }
  void store_kv(const KvLayerView&, const float*, const float*, const int32_t*, int64_t) override { no_ops(); }
  void attention(const KvLayerView&, const AttentionBatch&, const float*, int64_t, float, float*) override { no_ops(); }
  void silu_mul(const float*, const float*, int64_t, int64_t, int64_t, float*) override { no_ops(); }
  void add(float*, const float*, int64_t) override { no_ops(); }
  void add_rms_norm(float*, const float*, const float*, float*, int64_t, int64_t, float) override { no_ops(); }
  void rope_store_qkv(const KvLayerView&, const float*, const int32_t*, const int32_t*, int64_t, int64_t, const RopeParams&,
                      float*) override {
    no_ops();
  }

 private:
  [[noreturn]] static void no_ops() { throw std::logic_error("Bf16DeviceBackend runs no ops"); }
  bool keep_fp8_;
  cpu::CpuBackend cpu_{1};
};

// A checkpoint directory (model.safetensors) of one layer's FP8 projections, in the test's own folder (ctest runs
// tests in parallel processes).
class Fp8Loading : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("servetune_fp8_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    q_ = make_fp8(300, 260, 1);     // partial blocks both ways
    down_ = make_fp8(64, 260, 2);   // row-parallel: split by columns
    gate_ = make_fp8(300, 256, 3);  // gate / up: a stacking candidate
    up_ = make_fp8(300, 256, 4);
    k_ = make_fp8(200, 260, 5);
    v_ = make_fp8(64, 260, 6);
    const std::vector<float> k_scales_wrong(2 * 2, 1.0f);  // [2, 2]; [2, 3] would fit
    const std::vector<SafetensorsWriteTensor> tensors = {
        fp8("model.layers.0.self_attn.q_proj.weight", q_),
        scales("model.layers.0.self_attn.q_proj.weight_scale_inv", q_),
        fp8("model.layers.0.mlp.down_proj.weight", down_),
        scales("model.layers.0.mlp.down_proj.weight_scale_inv", down_),
        fp8("model.layers.0.mlp.gate_proj.weight", gate_),
        scales("model.layers.0.mlp.gate_proj.weight_scale_inv", gate_),
        fp8("model.layers.0.mlp.up_proj.weight", up_),
        scales("model.layers.0.mlp.up_proj.weight_scale_inv", up_),
        fp8("model.layers.0.self_attn.k_proj.weight", k_),
        {"model.layers.0.self_attn.k_proj.weight_scale_inv", DType::kF32, {2, 2}, bytes_of(k_scales_wrong)},
        fp8("model.layers.0.self_attn.v_proj.weight", v_),  // no scales
    };
    write_safetensors((dir_ / "model.safetensors").string(), tensors);
    set_ = std::make_unique<SafetensorsSet>(dir_.string());
    source_ = std::make_unique<SafetensorsWeightSource>(*set_, dir_.string(), false, "llama");
  }
  void TearDown() override {
    source_.reset();
    set_.reset();
    fs::remove_all(dir_);
  }

  static SafetensorsWriteTensor fp8(const std::string& name, const Fp8Tensor& t) {
    return {name, DType::kFP8_E4M3, {t.rows, t.cols}, t.codes};
  }
  static SafetensorsWriteTensor scales(const std::string& name, const Fp8Tensor& t) {
    return {name, DType::kF32, {(t.rows + 127) / 128, t.block_cols()}, bytes_of(t.scales)};
  }

  fs::path dir_;
  Fp8Tensor q_, down_, gate_, up_, k_, v_;
  std::unique_ptr<SafetensorsSet> set_;
  std::unique_ptr<SafetensorsWeightSource> source_;
};

// y = x · Wᵀ in float64 for rows [r0, r0 + rows) and columns [c0, c0 + cols) of `t`.
std::vector<double> exact_product(const Fp8Tensor& t, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                                  const std::vector<float>& x, int64_t n_tokens) {
  std::vector<double> y(static_cast<size_t>(n_tokens * rows));
  for (int64_t i = 0; i < n_tokens; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) {
        sum += static_cast<double>(t.value(r0 + r, c0 + c)) * x[static_cast<size_t>(i * cols + c)];
      }
      y[static_cast<size_t>(i * rows + r)] = sum;
    }
  }
  return y;
}

std::vector<float> activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

void expect_matmul_near(Backend& backend, const WeightMatrix& w, const std::vector<double>& want,
                        const std::vector<float>& x, int64_t n_tokens) {
  std::vector<float> y(static_cast<size_t>(n_tokens * w.rows));
  backend.matmul(w, nullptr, x.data(), n_tokens, y.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-4 * (1.0 + std::fabs(want[i]))) << "output " << i;
}

TEST_F(Fp8Loading, WholeMatrixKeepsCodesAndScalesOnTheCpu) {
  cpu::CpuBackend backend(2);
  WeightLoader loader(*source_, backend, ParallelContext{0, 1, nullptr});
  const WeightMatrix w = loader.matrix("blk.0.attn_q.weight", 300, 260);
  EXPECT_EQ(w.type, DType::kFP8_E4M3_B128);
  EXPECT_EQ(w.rows, 300);
  EXPECT_EQ(w.cols, 260);
  EXPECT_EQ(w.row_bytes, 260);
  EXPECT_EQ(std::memcmp(w.data, q_.codes.data(), q_.codes.size()), 0) << "codes as the file has them";
  ASSERT_NE(w.scales.data, nullptr);
  EXPECT_EQ(w.scales.stride, 4) << "3 column blocks, rows of scales 16 bytes apart (fp8_scale_stride)";
  EXPECT_EQ(w.scales.row_offset, 0);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(std::vector<float>(w.scales.data + r * 4, w.scales.data + r * 4 + 3),
              std::vector<float>(q_.scales.begin() + static_cast<std::ptrdiff_t>(r * 3), q_.scales.begin() + static_cast<std::ptrdiff_t>(r * 3 + 3)));
  }
  for (int64_t n_tokens : {1, 3, 17}) {
    const std::vector<float> x = activations(n_tokens * 260, 10);
    expect_matmul_near(backend, w, exact_product(q_, 0, 300, 0, 260, x, n_tokens), x, n_tokens);
  }
  EXPECT_FALSE(loader.has("blk.0.attn_output.weight"));
}

// Column-parallel slices for any tp_size: the ones starting inside a 128-row block keep its scales through the row
// offset, and each rank's outputs are those rows of the whole matrix's, bit for bit.
TEST_F(Fp8Loading, RowSlicesStartAnywhere) {
  cpu::CpuBackend backend(1);
  const std::vector<float> x = activations(5 * 260, 11);
  WeightLoader whole_loader(*source_, backend, ParallelContext{0, 1, nullptr});
  const WeightMatrix whole = whole_loader.matrix("blk.0.attn_q.weight", 300, 260);
  std::vector<float> y_whole(5 * 300);
  backend.matmul(whole, nullptr, x.data(), 5, y_whole.data());
  for (int tp : {2, 3, 4, 7}) {
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const SliceRange range = balanced_slice(300, tp, rank);
      WeightLoader loader(*source_, backend, ParallelContext{rank, tp, nullptr});
      const WeightMatrix w = loader.matrix_rows("blk.0.attn_q.weight", 300, 260, range);
      ASSERT_EQ(w.rows, range.count);
      EXPECT_EQ(w.scales.row_offset, range.begin % 128);
      EXPECT_EQ(std::memcmp(w.data, q_.codes.data() + range.begin * 260, static_cast<size_t>(range.count * 260)), 0);
      std::vector<float> y(static_cast<size_t>(5 * range.count));
      backend.matmul(w, nullptr, x.data(), 5, y.data());
      for (int64_t t = 0; t < 5; ++t) {
        ASSERT_EQ(std::memcmp(y.data() + t * range.count, y_whole.data() + t * 300 + range.begin,
                              static_cast<size_t>(range.count) * sizeof(float)),
                  0);
      }
    }
  }
}

// Row-parallel slices must start on a 128-column scale block and end on one or at the last column.
TEST_F(Fp8Loading, ColumnSlicesFollowScaleBlocks) {
  cpu::CpuBackend backend(1);
  for (const SliceRange range : {SliceRange{0, 128}, SliceRange{128, 132}, SliceRange{128, 128}, SliceRange{256, 4}}) {
    SCOPED_TRACE("columns [" + std::to_string(range.begin) + ", " + std::to_string(range.begin + range.count) + ")");
    WeightLoader loader(*source_, backend, ParallelContext{1, 2, nullptr});
    const WeightMatrix w = loader.matrix_cols("blk.0.ffn_down.weight", 64, 260, range);
    EXPECT_EQ(w.type, DType::kFP8_E4M3_B128);
    ASSERT_EQ(w.cols, range.count);
    EXPECT_EQ(w.scales.stride, fp8_scale_stride(range.count));
    EXPECT_EQ(w.scales.data[0], down_.scales[static_cast<size_t>(range.begin / 128)]);
    const std::vector<float> x = activations(3 * range.count, 12);
    expect_matmul_near(backend, w, exact_product(down_, 0, 64, range.begin, range.count, x, 3), x, 3);
  }
  WeightLoader loader(*source_, backend, ParallelContext{1, 2, nullptr});
  try {
    loader.matrix_cols("blk.0.ffn_down.weight", 64, 260, balanced_slice(260, 2, 1));  // [130, 260)
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    const std::string what = e.what();
    for (const char* part : {"blk.0.ffn_down.weight", "tp_size 2", "[130, 260)", "128-column"}) {
      EXPECT_NE(what.find(part), std::string::npos) << what;
    }
  }
  EXPECT_THROW(loader.matrix_cols("blk.0.ffn_down.weight", 64, 260, SliceRange{0, 200}), Error);
}

TEST_F(Fp8Loading, WrongScaleShapeNamesTheScaleTensor) {
  cpu::CpuBackend backend(1);
  WeightLoader loader(*source_, backend, ParallelContext{0, 1, nullptr});
  try {
    loader.matrix("blk.0.attn_k.weight", 200, 260);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    const std::string what = e.what();
    for (const char* part : {"model.layers.0.self_attn.k_proj.weight_scale_inv", "[2, 2]", "[2, 3]"}) {
      EXPECT_NE(what.find(part), std::string::npos) << what;
    }
  }
}

TEST_F(Fp8Loading, MissingScalesAreAFormatError) {
  cpu::CpuBackend backend(1);
  WeightLoader loader(*source_, backend, ParallelContext{0, 1, nullptr});
  try {
    loader.matrix_rows("blk.0.attn_v.weight", 64, 260, SliceRange{0, 32});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.v_proj.weight_scale_inv"), std::string::npos) << e.what();
  }
}

// The CPU keeps FP8 matrices block-scaled, so fused gate/up stays two matrices there.
TEST_F(Fp8Loading, CpuKeepsFp8MatricesUnstacked) {
  cpu::CpuBackend backend(1);
  WeightLoader loader(*source_, backend, ParallelContext{0, 1, nullptr});
  EXPECT_FALSE(loader.stackable({"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"}));
  const std::vector<WeightLoader::RowPart> gate_up = {{"blk.0.ffn_gate.weight", 300, 256, {0, 300}},
                                                      {"blk.0.ffn_up.weight", 300, 256, {0, 300}}};
  EXPECT_THROW(loader.stacked_rows(gate_up), Error);
}

// `w` is rows [r0, ...) x columns [c0, ...) of `t` as bf16: each weight code · scale rounded to bf16.
void expect_bf16(const WeightMatrix& w, const Fp8Tensor& t, int64_t r0, int64_t c0) {
  ASSERT_EQ(w.type, DType::kBF16);
  EXPECT_EQ(w.scales.data, nullptr);
  const auto* values = static_cast<const uint16_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < w.cols; ++c) {
      ASSERT_EQ(values[r * w.cols + c], f32_to_bf16(t.value(r0 + r, c0 + c))) << "r=" << r << " c=" << c;
    }
  }
}

// A device backend gets bf16, slices and stacks included.
TEST_F(Fp8Loading, DeviceBackendsGetBf16) {
  Bf16DeviceBackend backend;
  WeightLoader loader(*source_, backend, ParallelContext{1, 2, nullptr});
  expect_bf16(loader.matrix("blk.0.attn_q.weight", 300, 260), q_, 0, 0);
  expect_bf16(loader.matrix_rows("blk.0.attn_q.weight", 300, 260, SliceRange{150, 150}), q_, 150, 0);
  expect_bf16(loader.matrix_cols("blk.0.ffn_down.weight", 64, 260, SliceRange{128, 132}), down_, 0, 128);
  ASSERT_TRUE(loader.stackable({"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"}));
  const WeightMatrix gate_up =
      loader.stacked_rows({{"blk.0.ffn_gate.weight", 300, 256, {150, 150}}, {"blk.0.ffn_up.weight", 300, 256, {150, 150}}});
  ASSERT_EQ(gate_up.rows, 300);
  WeightMatrix gate = gate_up, up = gate_up;
  gate.rows = up.rows = 150;
  up.data = static_cast<const uint8_t*>(gate_up.data) + 150 * gate_up.row_bytes;
  expect_bf16(gate, gate_, 150, 0);
  expect_bf16(up, up_, 150, 0);
  auto keep = loader.take_buffers();
  // Bad scales are the same errors there.
  EXPECT_THROW(loader.matrix("blk.0.attn_k.weight", 200, 260), Error);
}

// A device that keeps FP8 (CUDA on sm_90) keeps the matrices its FP8 GEMM takes, codes as in the file and scales at
// 16-byte strides; the others become bf16, matrix by matrix: 260 columns (not a multiple of 16), a row slice starting
// inside a 128-row scale block.
TEST_F(Fp8Loading, Fp8DeviceKeepsTheShapesItsGemmTakes) {
  Bf16DeviceBackend backend(true);
  WeightLoader loader(*source_, backend, ParallelContext{0, 1, nullptr});
  const WeightMatrix gate = loader.matrix("blk.0.ffn_gate.weight", 300, 256);
  ASSERT_EQ(gate.type, DType::kFP8_E4M3_B128);
  EXPECT_EQ(std::memcmp(gate.data, gate_.codes.data(), gate_.codes.size()), 0);
  EXPECT_EQ(gate.scales.stride, 4);
  for (int64_t r = 0; r < 300; r += 7) {
    for (int64_t c = 0; c < 256; c += 5) EXPECT_EQ(gate.scales.at(r, c), gate_.scales[static_cast<size_t>(r / 128 * 2 + c / 128)]);
  }
  const WeightMatrix second = loader.matrix_rows("blk.0.ffn_up.weight", 300, 256, SliceRange{128, 172});
  ASSERT_EQ(second.type, DType::kFP8_E4M3_B128) << "a slice on a block boundary stays FP8";
  EXPECT_EQ(second.scales.row_offset, 0);
  EXPECT_EQ(second.scales.at(0, 200), up_.scales[static_cast<size_t>(1 * 2 + 1)]);
  expect_bf16(loader.matrix("blk.0.attn_q.weight", 300, 260), q_, 0, 0);
  expect_bf16(loader.matrix_rows("blk.0.ffn_up.weight", 300, 256, SliceRange{100, 200}), up_, 100, 0);
  EXPECT_FALSE(loader.stackable({"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"})) << "FP8 kept: no stacking";
}

}  // namespace
}  // namespace servetune
