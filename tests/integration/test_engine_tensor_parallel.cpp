// Tensor parallelism over the local communicator on stories260K and random-weight llamas (make-model's `tiny`, 4 heads /
// 2 KV heads, and `tiny-gqa`, 12 heads / 3 KV heads / vocab 500): logits of tp 2, 3, 4 and 6 (uneven KV groups,
// replicated KV heads, uneven vocabulary split) match tp 1 within 1e-5 relative; greedy outputs of a mixed batch with
// chunked prefill are identical to tp 1, also with tp 2 x dp 2; collective time is reported; bad splits are clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/make_model.h"
#include "runtime/tensor_parallel_group.h"
#include "servetune/engine.h"
#include "integration/greedy_jobs.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

constexpr int64_t kPage = 16;

// A random-weight model written once per test binary run, removed at exit.
class RandomModel {
 public:
  explicit RandomModel(const std::string& preset)
      : dir_(std::filesystem::temp_directory_path() / ("servetune_tp_" + preset + "_" + std::to_string(::getpid()))) {
    write_random_model(model_preset(preset), dir_.string(), 11, DType::kF32, 0.02f);
  }
  ~RandomModel() { std::filesystem::remove_all(dir_); }
  std::string path() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

struct SeqState {
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  int64_t computed = 0;
  int32_t first_block = 0;
};

// The next step of `seqs`: up to `chunk` uncomputed tokens of each; sequences reaching their end sample.
Batch next_batch(const std::vector<SeqState>& seqs, int64_t chunk, int64_t max_blocks) {
  Batch b;
  b.max_blocks_per_seq = max_blocks;
  b.block_tables.assign(seqs.size() * static_cast<size_t>(max_blocks), -1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqState& s = seqs[i];
    for (int64_t k = 0; k < max_blocks; ++k) b.block_tables[i * static_cast<size_t>(max_blocks) + static_cast<size_t>(k)] = s.first_block + static_cast<int32_t>(k);
    const int64_t end = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()), s.computed + chunk);
    for (int64_t p = s.computed; p < end; ++p) {
      b.tokens.push_back(s.tokens[static_cast<size_t>(p)]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.seq_of_token.push_back(static_cast<int32_t>(i));
      b.slot_mapping.push_back(static_cast<int32_t>((s.first_block + p / kPage) * kPage + p % kPage));
    }
    if (end == static_cast<int64_t>(s.tokens.size()) && end > s.computed) b.logits_indices.push_back(static_cast<int32_t>(b.tokens.size() - 1));
  }
  return b;
}

// Runs three prompts (chunked prefill of 8 tokens a step, then greedy decoding) on tp 1 and on each of `tp_sizes`
// in lockstep, feeding all the tokens tp 1 picks, and checks every logits row against tp 1's.
void expect_logits_match(const std::string& model, const std::vector<int>& tp_sizes) {
  Checkpoint ck(model, LoadFormat::kAuto);
  const int64_t vocab = ck.config().vocab;
  constexpr int64_t kMaxBlocks = 6;
  std::vector<int> sizes = {1};
  sizes.insert(sizes.end(), tp_sizes.begin(), tp_sizes.end());
  std::vector<std::unique_ptr<TensorParallelGroup>> groups;
  for (int tp : sizes) {
    groups.push_back(std::make_unique<TensorParallelGroup>(ck, "cpu", tp, 1));
    groups.back()->create_kv(3 * kMaxBlocks, kPage, DType::kF32);
  }
  std::vector<SeqState> seqs(3);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int64_t k = 0; k < 5 + 9 * static_cast<int64_t>(i); ++k) seqs[i].tokens.push_back(static_cast<int32_t>(3 + (i * 37 + static_cast<size_t>(k) * 11) % 250));
    seqs[i].prompt_len = static_cast<int64_t>(seqs[i].tokens.size());
    seqs[i].first_block = static_cast<int32_t>(i * kMaxBlocks);
  }
  double worst = 0.0;
  int64_t rows_checked = 0;
  for (int step = 0; step < 16; ++step) {
    const Batch batch = next_batch(seqs, 8, kMaxBlocks);
    std::vector<std::vector<float>> logits(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) groups[g]->forward(batch, logits[g]);
    const auto& ref = logits[0];
    ASSERT_EQ(ref.size(), batch.logits_indices.size() * static_cast<size_t>(vocab));
    for (size_t g = 1; g < groups.size(); ++g) {
      ASSERT_EQ(logits[g].size(), ref.size()) << "tp " << sizes[g];
      for (size_t row = 0; row < batch.logits_indices.size(); ++row) {
        float scale = 0.0f, diff = 0.0f;
        for (int64_t v = 0; v < vocab; ++v) {
          const size_t at = row * static_cast<size_t>(vocab) + static_cast<size_t>(v);
          scale = std::max(scale, std::fabs(ref[at]));
          diff = std::max(diff, std::fabs(ref[at] - logits[g][at]));
        }
        const double rel = diff / std::max(scale, 1e-30f);
        worst = std::max(worst, rel);
        EXPECT_LE(rel, 1e-5) << model << " tp " << sizes[g] << " step " << step << " row " << row;
        ++rows_checked;
      }
    }
    // Advance: computed tokens, and tp 1's greedy pick for every sequence that sampled.
    size_t row = 0;
    for (SeqState& s : seqs) {
      const int64_t end = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()), s.computed + 8);
      const bool sampled = end == static_cast<int64_t>(s.tokens.size()) && end > s.computed;
      s.computed = end;
      if (!sampled) continue;
      const float* r = ref.data() + row++ * static_cast<size_t>(vocab);
      s.tokens.push_back(static_cast<int32_t>(std::max_element(r, r + vocab) - r));
    }
  }
  EXPECT_GT(rows_checked, 30);
  std::printf("%s: worst relative logits difference to tp 1 over %lld rows: %.3g\n", model.c_str(),
              static_cast<long long>(rows_checked), worst);
}

TEST(TensorParallelLogits, StoriesMatchOneRank) {
  expect_logits_match(testing::stories_path(), {2, 4});
}

TEST(TensorParallelLogits, RandomLlamaWithUnevenAndReplicatedKvHeadsMatchesOneRank) {
  const RandomModel gqa("tiny-gqa");
  expect_logits_match(gqa.path(), {2, 3, 6});  // KV groups 2+1 (uneven), 1 each, each replicated on 2 ranks
  const RandomModel tiny("tiny");
  expect_logits_match(tiny.path(), {2, 4});  // 2 KV heads replicated over 4 ranks
}

using testing::Job;

EngineConfig config_for(const std::string& model, int tp, int dp) {
  EngineConfig c;
  c.model = model;
  c.threads = std::max(2, tp * dp);
  c.tp_size = tp;
  c.dp_size = dp;
  c.max_total_tokens = 16384;
  c.chunked_prefill_size = 16;  // long prompts take several steps
  c.max_prefill_tokens = 48;
  return c;
}

void expect_greedy_identical(const std::string& model, const std::vector<std::pair<int, int>>& layouts) {
  std::vector<Job> jobs;
  std::vector<std::vector<int32_t>> reference;
  {
    Engine engine(config_for(model, 1, 1));
    jobs = testing::mixed_jobs(engine.tokenizer(), 16, 40);
    reference = testing::run_greedy(engine, jobs, true);
    EXPECT_EQ(engine.stats().comm_seconds, 0.0);
  }
  for (size_t i = 0; i < jobs.size(); ++i) ASSERT_EQ(reference[i].size(), static_cast<size_t>(jobs[i].max_tokens));
  for (const auto& [tp, dp] : layouts) {
    Engine engine(config_for(model, tp, dp));
    const auto outs = testing::run_greedy(engine, jobs, true);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i], reference[i]) << model << " tp " << tp << " dp " << dp << ": request " << i;
    const EngineStats s = engine.stats();
    EXPECT_GT(s.comm_seconds, 0.0) << "tp " << tp;
    EXPECT_GT(s.forward_seconds, s.comm_seconds) << "tp " << tp;
    EXPECT_EQ(s.kv_blocks_used, 0);
  }
}

TEST(EngineTensorParallel, StoriesGreedyOutputsIdenticalToOneRankWithChunkedPrefill) {
  expect_greedy_identical(testing::stories_path(), {{2, 1}, {4, 1}, {2, 2}});
}

TEST(EngineTensorParallel, RandomLlamaGreedyOutputsIdenticalToOneRank) {
  const RandomModel gqa("tiny-gqa");
  expect_greedy_identical(gqa.path(), {{2, 1}, {6, 1}, {2, 2}});
}

void expect_usage_error(const EngineConfig& c, const std::vector<std::string>& words) {
  try {
    Engine engine(c);
    ADD_FAILURE() << "expected an error for tp " << c.tp_size;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(EngineTensorParallel, SplitsThatDoNotFitAreClearErrors) {
  const RandomModel gqa("tiny-gqa");
  // 12 heads in 3 KV groups cannot go over 4 ranks (4 is neither <= 3 nor a multiple of 3).
  expect_usage_error(config_for(gqa.path(), 4, 1), {"tp_size 4", "12 attention heads", "3 KV heads"});
  // stories260K's feed-forward dimension 172 does not divide by 8.
  expect_usage_error(config_for(testing::stories_path(), 8, 1), {"tp_size 8", "feed-forward dimension 172"});
  // tp x dp ranks need a thread each.
  EngineConfig c = config_for(testing::stories_path(), 2, 2);
  c.threads = 3;
  expect_usage_error(c, {"tp_size x dp_size = 4 ranks need at least one thread each, but threads = 3"});
}

}  // namespace
}  // namespace servetune
