// The GPU flash-decoding plan and merge (backend/cuda/split_attention_plan.h) on the CPU: every position in exactly
// one non-empty, page-aligned chunk; a single pass for big batches and short contexts; and partial softmaxes merged
// the way the kernels do (row slots, then chunks) equal a one-pass softmax-weighted sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/split_attention_plan.h"

namespace servetune::gpu {
namespace {

constexpr int64_t kH200Sms = 132;

// Every n_ctx the plan can meet (1 .. max_pages * page_size, and past it): chunks [begin, end) of the used ones
// tile [0, n_ctx) in order, each non-empty and starting on a page boundary.
void expect_covers(const SplitPlan& plan, int64_t max_pages) {
  const int64_t longest = max_pages * plan.page_size;
  for (int64_t n_ctx = 1; n_ctx <= longest + 2 * plan.page_size; n_ctx += (n_ctx < 300 ? 1 : 37)) {
    const int64_t used = plan.chunks_used(n_ctx);
    ASSERT_GE(used, 1);
    ASSERT_LE(used, plan.n_chunks);
    int64_t next = 0;
    for (int64_t c = 0; c < used; ++c) {
      const int64_t begin = plan.chunk_begin(c), end = plan.chunk_end(c, n_ctx);
      ASSERT_EQ(begin, next) << "n_ctx " << n_ctx << " chunk " << c;
      ASSERT_LT(begin, end) << "empty chunk " << c << " of n_ctx " << n_ctx;
      ASSERT_EQ(begin % plan.page_size, 0) << "chunk " << c << " not page aligned";
      next = end;
    }
    ASSERT_EQ(next, n_ctx);
    // Chunks past the used ones would be empty: the kernel skips them and the merge never reads them.
    if (used < plan.n_chunks) {
      ASSERT_GE(plan.chunk_begin(used), n_ctx);
    }
  }
}

TEST(SplitAttentionPlan, CoversEveryPositionOnceInPageAlignedChunks) {
  for (int64_t page : {1, 3, 16, 256}) {
    for (int64_t units : {1, 4, 8, 32, 100}) {
      for (int64_t max_pages : {1, 2, 9, 63, 313, 2000}) {
        const SplitPlan plan = plan_split_attention(units, max_pages, page, kH200Sms);
        EXPECT_EQ(plan.page_size, page);
        if (plan.n_chunks == 1) continue;
        EXPECT_GE(plan.chunk_len(), kMinChunkPositions);
        EXPECT_LE(plan.n_chunks * plan.chunk_pages, max_pages + plan.chunk_pages - 1);  // no chunk only past the end
        expect_covers(plan, max_pages);
      }
    }
  }
}

TEST(SplitAttentionPlan, SplitsOnlySmallBatchesWithLongContexts) {
  // Batch 1 of Llama-8B (8 KV heads, 4 query heads each: 8 blocks) at 5000 positions, pages of 16.
  const SplitPlan decode = plan_split_attention(8, 313, 16, kH200Sms);
  EXPECT_GT(decode.n_chunks, 1);
  EXPECT_LE(decode.n_chunks * 8, kH200Sms * kSplitBlocksPerSm);  // fills the GPU, not many times over
  // A big batch fills the GPU without splitting; so do short contexts (under two minimum chunks) and a bad device.
  EXPECT_EQ(plan_split_attention(kH200Sms * kSplitBlocksPerSm / 2 + 1, 313, 16, kH200Sms).n_chunks, 1);
  EXPECT_EQ(plan_split_attention(256 * 8, 313, 16, kH200Sms).n_chunks, 1);
  EXPECT_EQ(plan_split_attention(8, (2 * kMinChunkPositions - 1) / 16, 16, kH200Sms).n_chunks, 1);
  EXPECT_EQ(plan_split_attention(8, 1, 256, kH200Sms).n_chunks, 1);
  EXPECT_EQ(plan_split_attention(8, 313, 16, 0).n_chunks, 1);
  // Page 256, 1000 positions: four one-page chunks.
  const SplitPlan big_pages = plan_split_attention(8, 4, 256, kH200Sms);
  EXPECT_EQ(big_pages.n_chunks, 4);
  EXPECT_EQ(big_pages.chunk_pages, 1);
  // A single pass is one chunk holding everything.
  const SplitPlan single = plan_split_attention(100000, 313, 16, kH200Sms);
  EXPECT_EQ(single.chunks_used(5000), 1);
  EXPECT_EQ(single.chunk_begin(0), 0);
  EXPECT_EQ(single.chunk_end(0, 5000), 5000);
}

TEST(SplitAttentionPlan, MergeOfEmptyPartialsIsEmptyNotNan) {
  const SoftmaxMerge both = softmax_merge(-INFINITY, 0.0f, -INFINITY, 0.0f);
  EXPECT_EQ(both.l, 0.0f);
  EXPECT_EQ(both.fa, 0.0f);
  EXPECT_EQ(both.fb, 0.0f);
  const SoftmaxMerge one = softmax_merge(-INFINITY, 0.0f, 2.5f, 3.0f);
  EXPECT_EQ(one.m, 2.5f);
  EXPECT_EQ(one.l, 3.0f);
  EXPECT_EQ(one.fa, 0.0f);
  EXPECT_EQ(one.fb, 1.0f);
}

// A partial softmax over some positions: running max, sum, and the unnormalised weighted values.
struct Partial {
  explicit Partial(int64_t dim) : acc(static_cast<size_t>(dim), 0.0f) {}
  float m = -INFINITY, l = 0.0f;  // empty: saw no position
  std::vector<float> acc;
};
void merge_into(Partial& into, float m, float l, const float* acc) {
  const SoftmaxMerge s = softmax_merge(into.m, into.l, m, l);
  for (size_t d = 0; d < into.acc.size(); ++d) into.acc[d] = into.acc[d] * s.fa + acc[d] * s.fb;
  into.m = s.m;
  into.l = s.l;
}

// As the kernels compute it: in each chunk, row_slots slots take positions begin + slot, + row_slots, ... one score
// at a time; the slots merge into the chunk's partial; then, per element, the used chunks merge in order and the sum
// is normalised (merge_chunks_kernel).
std::vector<float> split_attention(const SplitPlan& plan, const std::vector<float>& scores,
                                   const std::vector<float>& values, int64_t dim, int64_t row_slots) {
  const auto n_ctx = static_cast<int64_t>(scores.size());
  std::vector<Partial> chunks;
  for (int64_t c = 0; c < plan.chunks_used(n_ctx); ++c) {
    std::vector<Partial> slots(static_cast<size_t>(row_slots), Partial(dim));
    for (int64_t j = plan.chunk_begin(c); j < plan.chunk_end(c, n_ctx); ++j) {
      Partial& s = slots[static_cast<size_t>((j - plan.chunk_begin(c)) % row_slots)];
      merge_into(s, scores[static_cast<size_t>(j)], 1.0f, &values[static_cast<size_t>(j * dim)]);
    }
    Partial chunk(dim);
    for (const Partial& s : slots) merge_into(chunk, s.m, s.l, s.acc.data());
    EXPECT_GT(chunk.l, 0.0f) << "chunk " << c << " of n_ctx " << n_ctx << " saw no position";
    chunks.push_back(chunk);
  }
  std::vector<float> out(static_cast<size_t>(dim));
  for (size_t d = 0; d < out.size(); ++d) {
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (const Partial& chunk : chunks) softmax_merge_into(m, l, acc, chunk.m, chunk.l, chunk.acc[d]);
    out[d] = acc / l;
  }
  return out;
}

TEST(SplitAttentionPlan, MergedChunksEqualOnePassSoftmax) {
  const int64_t dim = 8;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> score_dist(-12.0f, 12.0f), value_dist(-1.0f, 1.0f);
  for (int64_t page : {16, 256}) {
    for (int64_t n_ctx : {1, 17, 255, 256, 257, 1000, 5000}) {
      const int64_t max_pages = (5000 + page - 1) / page;  // the batch's longest context, as a mixed batch has
      const SplitPlan plan = plan_split_attention(1, max_pages, page, kH200Sms);
      ASSERT_GT(plan.n_chunks, 1);
      std::vector<float> scores(static_cast<size_t>(n_ctx)), values(static_cast<size_t>(n_ctx * dim));
      for (float& s : scores) s = score_dist(rng);
      for (float& v : values) v = value_dist(rng);
      double max_score = -INFINITY;
      for (float s : scores) max_score = std::max(max_score, static_cast<double>(s));
      std::vector<double> expected(static_cast<size_t>(dim), 0.0);
      double sum = 0.0;
      for (int64_t j = 0; j < n_ctx; ++j) {
        const double w = std::exp(scores[static_cast<size_t>(j)] - max_score);
        sum += w;
        for (int64_t d = 0; d < dim; ++d) expected[static_cast<size_t>(d)] += w * values[static_cast<size_t>(j * dim + d)];
      }
      for (int64_t row_slots : {4, 16}) {
        const std::vector<float> got = split_attention(plan, scores, values, dim, row_slots);
        for (int64_t d = 0; d < dim; ++d) {
          EXPECT_NEAR(got[static_cast<size_t>(d)], expected[static_cast<size_t>(d)] / sum, 1e-5)
              << "page " << page << " n_ctx " << n_ctx << " slots " << row_slots << " d " << d;
        }
      }
    }
  }
}

}  // namespace
}  // namespace servetune::gpu
