// Tensor-parallel weight slicing: row slices (column-parallel layers) and quant-block column slices (row-parallel
// layers) of f32 and Q8_0 matrices reassemble to the original bytes; misaligned splits are clear errors; and the
// head / KV-group / feed-forward / vocabulary partition covers every index once (KV heads replicated when needed);
// a host backend gets each matrix of a mapped file copied once into large buffers, and the source hears which bytes
// were copied (sources that cannot give memory back are used in place).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "core/error.h"
#include "core/quant.h"
#include "model/model_config.h"
#include "model/parallel.h"
#include "model/weight_loader.h"

namespace servetune {
namespace {

// Named tensors held in memory.
class MemorySource final : public WeightSource {
 public:
  void add(const std::string& name, DType type, int64_t rows, int64_t cols, const std::vector<float>& values) {
    auto& bytes = data_[name];
    const int64_t row_bytes = *dtype_row_bytes(type, cols);
    bytes.resize(static_cast<size_t>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r) quantize_row(type, values.data() + r * cols, bytes.data() + r * row_bytes, cols);
    refs_[name] = TensorRef{name, type, {rows, cols}, bytes.data(), static_cast<int64_t>(bytes.size())};
  }
  const std::string& path() const override { return path_; }
  std::optional<TensorRef> find(const std::string& name) const override {
    auto it = refs_.find(name);
    if (it == refs_.end()) return std::nullopt;
    return it->second;
  }
  const std::vector<uint8_t>& bytes(const std::string& name) const { return data_.at(name); }
  void copied(const uint8_t* data, int64_t bytes) const override { copied_.emplace_back(data, bytes); }
  bool frees_copied() const override { return frees_; }
  bool frees_ = true;  // as a mapped file: host backends copy
  // The ranges the loader said it copied, in order.
  mutable std::vector<std::pair<const uint8_t*, int64_t>> copied_;

 private:
  std::string path_ = "memory";
  std::map<std::string, std::vector<uint8_t>> data_;
  std::map<std::string, TensorRef> refs_;
};

std::vector<float> random_values(int64_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

void expect_reassembles(MemorySource& source, const std::string& name, int64_t rows, int64_t cols, int tp, bool by_rows) {
  std::unique_ptr<Backend> backend = make_backend("cpu", 1);
  const auto& original = source.bytes(name);
  const int64_t full_row_bytes = *dtype_row_bytes(source.find(name)->type, cols);
  std::vector<uint8_t> rebuilt(original.size(), 0xAB);
  std::vector<std::unique_ptr<Buffer>> keep;
  for (int r = 0; r < tp; ++r) {
    WeightLoader loader(source, *backend, ParallelContext{r, tp, nullptr});
    if (by_rows) {
      const SliceRange range = balanced_slice(rows, tp, r);
      WeightMatrix w = loader.matrix_rows(name, rows, cols, range);
      ASSERT_EQ(w.rows, range.count);
      ASSERT_EQ(w.row_bytes, full_row_bytes);
      std::memcpy(rebuilt.data() + range.begin * full_row_bytes, w.data, static_cast<size_t>(w.rows * w.row_bytes));
    } else {
      const SliceRange range{cols / tp * r, cols / tp};
      WeightMatrix w = loader.matrix_cols(name, rows, cols, range);
      ASSERT_EQ(w.cols, range.count);
      const int64_t offset = *dtype_row_bytes(w.type, range.begin);
      for (int64_t row = 0; row < rows; ++row) {
        std::memcpy(rebuilt.data() + row * full_row_bytes + offset, static_cast<const uint8_t*>(w.data) + row * w.row_bytes,
                    static_cast<size_t>(w.row_bytes));
      }
    }
    for (auto& b : loader.take_buffers()) keep.push_back(std::move(b));
  }
  EXPECT_EQ(rebuilt, original) << name << " tp " << tp << (by_rows ? " rows" : " cols");
}

TEST(WeightSlicing, RowAndColumnSlicesReassembleTheOriginal) {
  MemorySource source;
  source.add("f32", DType::kF32, 7, 96, random_values(7 * 96));
  source.add("q8_0", DType::kQ8_0, 6, 128, random_values(6 * 128));
  source.add("q4_1", DType::kQ4_1, 5, 256, random_values(5 * 256));
  for (int tp : {1, 2, 3}) {
    expect_reassembles(source, "f32", 7, 96, tp, true);
    expect_reassembles(source, "f32", 7, 96, tp, false);
    expect_reassembles(source, "q8_0", 6, 128, tp, true);
  }
  for (int tp : {1, 2, 4}) {
    expect_reassembles(source, "q8_0", 6, 128, tp, false);
    expect_reassembles(source, "q4_1", 5, 256, tp, false);
  }
}

TEST(WeightSlicing, HostBackendsCopyEachMatrixOnceIntoLargeBuffers) {
  MemorySource source;
  source.add("embd", DType::kQ8_0, 10, 64, random_values(10 * 64));
  source.add("q4_1", DType::kQ4_1, 5, 256, random_values(5 * 256));
  std::unique_ptr<Backend> backend = make_backend("cpu", 1);
  WeightLoader loader(source, *backend, ParallelContext{0, 1, nullptr});
  const WeightMatrix table = loader.matrix("embd", 10, 64);
  const WeightMatrix head = loader.matrix_rows("embd", 10, 64, SliceRange{0, 10});  // a tied output head
  const WeightMatrix part = loader.matrix_rows("embd", 10, 64, SliceRange{2, 3});
  const WeightMatrix other = loader.matrix("q4_1", 5, 256);
  EXPECT_EQ(table.data, head.data) << "the same rows are copied once";
  const auto& embd = source.bytes("embd");
  for (const WeightMatrix* w : {&table, &part, &other}) {
    const auto* p = static_cast<const uint8_t*>(w->data);
    EXPECT_TRUE(p < embd.data() || p >= embd.data() + embd.size()) << "a copy, not the source's bytes";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  }
  EXPECT_EQ(std::memcmp(table.data, embd.data(), embd.size()), 0);
  EXPECT_EQ(std::memcmp(part.data, embd.data() + 2 * table.row_bytes, static_cast<size_t>(3 * table.row_bytes)), 0);
  EXPECT_EQ(std::memcmp(other.data, source.bytes("q4_1").data(), source.bytes("q4_1").size()), 0);
  // The source heard of each copy once (the tied head is the table's copy): whole table, rows 2-4, the Q4_1 matrix.
  const std::vector<std::pair<const uint8_t*, int64_t>> expected = {
      {embd.data(), static_cast<int64_t>(embd.size())},
      {embd.data() + 2 * table.row_bytes, 3 * table.row_bytes},
      {source.bytes("q4_1").data(), static_cast<int64_t>(source.bytes("q4_1").size())}};
  EXPECT_EQ(source.copied_, expected);
  // A column slice (tensor parallelism) leaves the rows' other columns to the other ranks: not reported.
  source.copied_.clear();
  WeightLoader rank(source, *backend, ParallelContext{0, 2, nullptr});
  const WeightMatrix half = rank.matrix_cols("q4_1", 5, 256, SliceRange{0, 128});
  EXPECT_EQ(half.cols, 128);
  EXPECT_TRUE(source.copied_.empty());
  // All in one buffer, large enough for the host backend's huge pages.
  const auto buffers = loader.take_buffers();
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_GE(buffers[0]->size(), size_t{2} << 20);
  const auto* base = static_cast<const uint8_t*>(buffers[0]->data());
  EXPECT_TRUE(static_cast<const uint8_t*>(other.data) > base &&
              static_cast<const uint8_t*>(other.data) < base + buffers[0]->size());
  // A source that cannot give memory back (dummy weights in memory) is used in place: a copy would double it.
  source.frees_ = false;
  WeightLoader in_place(source, *backend, ParallelContext{0, 1, nullptr});
  EXPECT_EQ(in_place.matrix("q4_1", 5, 256).data, source.bytes("q4_1").data());
}

TEST(WeightSlicing, BiasSlicesAreThePartOfTheVector) {
  const auto values = random_values(12);
  std::vector<uint8_t> raw(12 * sizeof(float));
  std::memcpy(raw.data(), values.data(), raw.size());
  class VectorSource final : public WeightSource {
   public:
    explicit VectorSource(const std::vector<uint8_t>& raw) : raw_(raw) {}
    const std::string& path() const override { return path_; }
    std::optional<TensorRef> find(const std::string& name) const override {
      return TensorRef{name, DType::kF32, {12}, raw_.data(), static_cast<int64_t>(raw_.size())};
    }

   private:
    std::string path_ = "memory";
    const std::vector<uint8_t>& raw_;
  } vectors(raw);
  std::unique_ptr<Backend> backend = make_backend("cpu", 1);
  WeightLoader loader(vectors, *backend, ParallelContext{1, 3, nullptr});
  const float* part = loader.vector("bias", 12, SliceRange{4, 4});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(part[i], values[static_cast<size_t>(4 + i)]);
}

TEST(WeightSlicing, ColumnSplitOffQuantBlocksNamesTensorAndTpSize) {
  MemorySource source;
  source.add("blk.0.ffn_down.weight", DType::kQ8_0, 4, 128, random_values(4 * 128));
  std::unique_ptr<Backend> backend = make_backend("cpu", 1);
  WeightLoader loader(source, *backend, ParallelContext{1, 8, nullptr});
  try {
    loader.matrix_cols("blk.0.ffn_down.weight", 4, 128, SliceRange{16, 16});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    const std::string what = e.what();
    EXPECT_NE(what.find("blk.0.ffn_down.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("tp_size 8"), std::string::npos) << what;
    EXPECT_NE(what.find("quant-block"), std::string::npos) << what;
  }
}

ModelConfig shape(int64_t heads, int64_t kv, int64_t ffn, int64_t vocab) {
  ModelConfig c;
  c.n_heads = heads;
  c.n_kv_heads = kv;
  c.ffn = ffn;
  c.vocab = vocab;
  c.head_dim = 16;
  c.hidden = heads * 16;
  return c;
}

TEST(TensorParallelShare, EveryQueryHeadReadsItsOwnKvHeadOnEveryRank) {
  struct Case {
    int64_t heads, kv;
    int tp;
  };
  for (const Case& k : {Case{12, 3, 2}, Case{12, 3, 3}, Case{12, 3, 6}, Case{12, 3, 12}, Case{9, 3, 2}, Case{8, 2, 4},
                        Case{32, 8, 8}, Case{14, 2, 2}, Case{8, 8, 1}}) {
    const ModelConfig c = shape(k.heads, k.kv, 24 * 12, 1001);
    std::vector<int> q_seen(static_cast<size_t>(k.heads), 0);
    int64_t vocab_next = 0, ffn_next = 0;
    for (int r = 0; r < k.tp; ++r) {
      const TensorParallelShare s = tensor_parallel_share(c, k.tp, r);
      ASSERT_GT(s.q_heads.count, 0);
      ASSERT_GT(s.kv_heads.count, 0);
      ASSERT_EQ(s.q_heads.count % s.kv_heads.count, 0);
      const int64_t local_group = s.q_heads.count / s.kv_heads.count;
      for (int64_t i = 0; i < s.q_heads.count; ++i) {
        const int64_t global_q = s.q_heads.begin + i;
        ++q_seen[static_cast<size_t>(global_q)];
        // The local attention maps query head i to local KV head i / local_group: it must be the global one.
        EXPECT_EQ(s.kv_heads.begin + i / local_group, global_q / (k.heads / k.kv)) << k.heads << "/" << k.kv << " tp " << k.tp;
      }
      EXPECT_EQ(s.vocab.begin, vocab_next);
      vocab_next += s.vocab.count;
      EXPECT_EQ(s.ffn.begin, ffn_next);
      ffn_next += s.ffn.count;
    }
    for (int seen : q_seen) EXPECT_EQ(seen, 1);
    EXPECT_EQ(vocab_next, c.vocab);
    EXPECT_EQ(ffn_next, c.ffn);
  }
}

TEST(TensorParallelShare, SplitsThatDoNotFitAreClearErrors) {
  const auto expect_usage = [](const ModelConfig& c, int tp, const std::vector<std::string>& words) {
    try {
      tensor_parallel_share(c, tp, 0);
      ADD_FAILURE() << "expected an error for tp " << tp;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  };
  expect_usage(shape(12, 3, 384, 500), 4, {"tp_size 4", "12 attention heads", "3 KV heads"});   // 4 % 3 != 0
  expect_usage(shape(6, 2, 384, 500), 4, {"tp_size 4", "3 query heads", "2 ranks"});             // 3 heads over 2 copies
  expect_usage(shape(8, 4, 172, 512), 8, {"tp_size 8", "feed-forward dimension 172"});
}

}  // namespace
}  // namespace servetune
