// KV rollback of speculative decoding, model-free: 10,000 random steps of drafts (some right, some wrong) through
// the real scheduler and block manager must never leak a block, never let a rejected token into the prefix cache,
// and always leave every sequence's tokens and computed count consistent.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "runtime/scheduler.h"

namespace servetune {
namespace {

constexpr int32_t kBad = 1000;  // rejected drafts use tokens >= kBad; true tokens are < kBad

int32_t truth(int64_t story, int64_t pos) { return static_cast<int32_t>((story * 131 + pos * 7 + (pos / 5) * 3) % 500); }

struct Live {
  std::unique_ptr<Sequence> seq;
  int64_t story;
};

TEST(SpeculativeRollback, NoLeaksNoRejectedTokensInCacheAfter10000Steps) {
  BlockManager bm(48, 4, true);
  SchedulerConfig cfg;
  cfg.max_running_requests = 8;
  cfg.max_batched_tokens = 40;
  cfg.chunked_prefill_size = 8;
  Scheduler sched(cfg, bm);
  std::mt19937_64 rng(12345);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<Live> live;
  int64_t next_id = 0, drafts = 0, accepted_total = 0, rejected_total = 0, preemptions = 0;

  auto add = [&] {
    auto s = std::make_unique<Sequence>();
    s->id = next_id++;
    const int64_t story = uni(0, 3);
    const int64_t prompt = uni(2, 24);
    for (int64_t p = 0; p < prompt; ++p) s->tokens.push_back(truth(story, p));
    s->prompt_len = prompt;
    s->max_total_len = prompt + uni(1, 40);
    sched.add(s.get());
    live.push_back({std::move(s), story});
  };
  auto finish = [&](Sequence* seq) {
    sched.remove(seq);
    std::erase_if(live, [&](const Live& l) { return l.seq.get() == seq; });
  };
  auto story_of = [&](const Sequence* seq) {
    for (const auto& l : live) {
      if (l.seq.get() == seq) return l.story;
    }
    ADD_FAILURE() << "unknown sequence";
    return int64_t{0};
  };

  for (int step = 0; step < 10000 || sched.has_work(); ++step) {
    ASSERT_LT(step, 20000) << "the workload does not drain";
    if (step < 10000) {
      while (live.size() < 12 && uni(0, 2) != 0) add();
    }
    // Drafts for decoding sequences: a random mix of right and wrong tokens.
    for (auto& l : live) {
      Sequence& s = *l.seq;
      if (s.status != SeqStatus::kRunning || s.num_uncomputed() != 1) continue;
      s.draft.clear();
      const int64_t k = uni(0, 5);
      const int64_t wrong_at = uni(0, 7);
      for (int64_t j = 0; j < k; ++j) {
        s.draft.push_back(j == wrong_at ? static_cast<int32_t>(kBad + uni(0, 99)) : truth(l.story, s.size() + j));
      }
    }
    SchedulerOutput out = sched.schedule();
    preemptions += static_cast<int64_t>(out.preempted.size());
    sched.complete(out);
    std::vector<Sequence*> done;
    for (const auto& ss : out.seqs) {
      Sequence* seq = ss.seq;
      ASSERT_LE(seq->num_computed, seq->size());
      if (!ss.samples) continue;
      const int64_t story = story_of(seq);
      const int64_t base = seq->num_computed;  // drafts occupy tokens [base, base + num_draft)
      ASSERT_EQ(seq->size(), base + ss.num_draft);
      int64_t accepted = 0;
      while (accepted < ss.num_draft && seq->tokens[static_cast<size_t>(base + accepted)] == truth(story, base + accepted)) ++accepted;
      seq->tokens.resize(static_cast<size_t>(base + accepted));
      seq->tokens.push_back(truth(story, seq->size()));  // the corrected (or bonus) token
      if (ss.num_draft > 0) {
        ++drafts;
        accepted_total += accepted;
        rejected_total += ss.num_draft - accepted;
        sched.accept_draft(seq, accepted);
      }
      ASSERT_EQ(seq->num_computed, seq->size() - 1);
      if (seq->size() >= seq->max_total_len || uni(0, 99) == 0) done.push_back(seq);
    }
    for (Sequence* seq : done) finish(seq);

    ASSERT_TRUE(bm.check_invariants()) << "step " << step;
    for (int32_t b = 0; b < static_cast<int32_t>(bm.num_blocks()); ++b) {
      for (int32_t t : bm.cached_tokens(b)) ASSERT_LT(t, kBad) << "a rejected draft token is in the prefix cache (step " << step << ")";
    }
    for (const auto& l : live) {
      const Sequence& s = *l.seq;
      for (int64_t p = 0; p < s.size(); ++p) ASSERT_EQ(s.tokens[static_cast<size_t>(p)], truth(l.story, p)) << "step " << step;
      if (s.status == SeqStatus::kRunning) {
        ASSERT_GE(static_cast<int64_t>(s.block_table.size()) * bm.page_size(), s.num_computed);
        // Rolled-back blocks are released: a running sequence holds no block past its tokens.
        ASSERT_LE(static_cast<int64_t>(s.block_table.size()), (s.size() + bm.page_size() - 1) / bm.page_size()) << "step " << step;
      } else {
        ASSERT_TRUE(s.block_table.empty());
      }
    }
  }
  EXPECT_EQ(bm.num_used_blocks(), 0);
  EXPECT_TRUE(bm.check_invariants());
  EXPECT_GT(drafts, 1000);
  EXPECT_GT(accepted_total, 0);
  EXPECT_GT(rejected_total, 0);
  EXPECT_GT(preemptions, 0) << "the cache is meant to be tight enough to preempt";
}

}  // namespace
}  // namespace servetune
