// Draft trees (speculative_eagle_topk > 1) end to end: greedy outputs identical with and without speculation at topk
// 2-4 (concurrency 1 and 32, chunked prefill, prefix caching, preemption) for a random EAGLE head on stories260K,
// DeepSeek-V3 tiny's trained MTP layer and SmolLM2's trained EAGLE head; sampled token distributions unchanged
// (chi-square); the same with tensor parallelism over threads; tree settings the engine cannot honour are clear errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/speculator.h"
#include "speculative_checks.h"

namespace servetune {
namespace {

// A random head rarely agrees with the target: identity through rejections of whole trees, partial paths and KV moves.
TEST(DraftTrees, Stories260KGreedyIdenticalWithRandomEagleHeadTopk2) {
  check_model(testing::stories_path(), kStoriesTexts, 64, 80, {"EAGLE", testing::data_path(kStoriesHead), -1.0, 3, 0, 2, 6});
}
TEST(DraftTrees, Stories260KGreedyIdenticalWithRandomEagleHeadTopk4) {
  check_model(testing::stories_path(), kStoriesTexts, 64, 80, {"EAGLE", testing::data_path(kStoriesHead), -1.0, 4, 0, 4, 12});
}
// The trained MTP layer (a latent cache: MLA tree attention in the target and in the head): drafts get accepted.
TEST(DraftTrees, DeepSeekV3MtpGreedyIdenticalTopk2) {
  check_model(testing::data_path(kMtpModel), kStoriesTexts, 32, 40, {"mtp", "", 0.05, 3, 0, 2, 6});
}
TEST(DraftTrees, DeepSeekV3MtpGreedyIdenticalTopk3AsEagle) {
  check_model(testing::data_path(kMtpModel), kStoriesTexts, 32, 40, {"EAGLE", "", 0.05, 2, 0, 3, 8});
}
// SGLang's llama default tree (5 steps, topk 4, 8 draft tokens) on the trained SmolLM2 head.
TEST(DraftTrees, SmolLM2GreedyIdenticalWithTrainedEagleHeadTopk4) {
  SERVETUNE_REQUIRE_FILE(testing::data_path("eagle/smollm2_head/model.safetensors"));
  check_model(testing::smollm2_path(), kSmolTexts, 40, 48, {"EAGLE", testing::data_path("eagle/smollm2_head"), 0.05, 5, 0, 4, 8});
}
// Tensor parallelism over threads: every rank verifies the tree with its heads' share of the mask and moves the
// accepted path's K/V in its own cache (GQA heads split; MLA's latent cache whole on each rank).
TEST(DraftTrees, SmolLM2GreedyIdenticalWithTrainedEagleHeadTopk2Tp2) {
  SERVETUNE_REQUIRE_FILE(testing::data_path("eagle/smollm2_head/model.safetensors"));
  Spec spec{"EAGLE", testing::data_path("eagle/smollm2_head"), 0.05, 3, 0, 2, 6};
  spec.tp_size = 2;  // SmolLM2's 3 KV heads split 2 + 1
  check_model(testing::smollm2_path(), kSmolTexts, 40, 48, spec);
}
TEST(DraftTrees, DeepSeekV3MtpGreedyIdenticalTopk2Tp2) {
  Spec spec{"mtp", "", 0.05, 3, 0, 2, 6};
  spec.tp_size = 2;
  check_model(testing::data_path(kMtpModel), kStoriesTexts, 32, 40, spec);
}

// Steps with 8 or more decoding requests draft nothing; the others verify trees.
TEST(DraftTrees, DeepSeekV3MtpGreedyIdenticalWhenDisabledByBatchSize) {
  check_model(testing::data_path(kMtpModel), kStoriesTexts, 32, 40, {"mtp", "", 0.05, 2, 8, 2, 5});
}

// Siblings verified by recursive rejection sampling keep the target's distribution.
TEST(DraftTrees, Stories260KSampledDistributionUnchangedWithEagleHeadTree) {
  check_sampled_distribution({"EAGLE", testing::data_path(kStoriesHead), 0.0, 3, 0, 3, 8});
}
TEST(DraftTrees, DeepSeekV3MtpSampledDistributionUnchangedWithTree) {
  check_sampled_distribution({"mtp", "", 0.0, 2, 0, 2, 5}, testing::data_path(kMtpModel));
}

TEST(DraftTrees, BadTreeSettingsAreClearErrors) {
  struct Bad {
    int steps, topk, draft_tokens;
    std::string device;
    int tp_size;
    ErrorKind kind;
    std::string says;
  };
  for (const Bad& b : {Bad{2, 2, 8, "cpu", 1, ErrorKind::kUsage, "exceeds the tree's 6 candidates"},
                       Bad{20, 4, 8, "cpu", 1, ErrorKind::kUsage, "must be at most 64 (the draft head's tree)"}}) {
    EngineConfig c = config(testing::data_path(kMtpModel), {"mtp", "", 0.0, b.steps, 0, b.topk, b.draft_tokens});
    c.device = parse_device(b.device);
    c.tp_size = b.tp_size;
    try {
      c.validate();
      ADD_FAILURE() << "steps " << b.steps << " topk " << b.topk << " draft tokens " << b.draft_tokens << " on " << b.device
                    << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), b.kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(b.says), std::string::npos) << e.what();
    }
  }
  // Trees run on the GPU backends too: a cuda config is refused only where this build has no cuda backend, never for
  // its tree.
  EngineConfig gpu = config(testing::data_path(kMtpModel), {"mtp", "", 0.0, 2, 0, 2, 5});
  gpu.device = parse_device("cuda");
  try {
    gpu.validate();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs the cuda build"), std::string::npos) << e.what();
  }
  EngineConfig ok = config(testing::data_path(kMtpModel), {"mtp", "", 0.0, 5, 0, 4, 8});
  EXPECT_NO_THROW(ok.validate());
  EngineConfig over_gloo = ok;  // ranks in other processes get the masks and K/V moves (test_engine_tensor_parallel_gloo)
  over_gloo.tp_size = 2;
  over_gloo.comm_backend = CommBackend::kGloo;
  over_gloo.dist_init_addr = "127.0.0.1:29500";
  EXPECT_NO_THROW(over_gloo.validate());
  ok.speculative_num_steps = 0;  // SGLang's llama defaults fill in the steps (5)
  ok.speculative_num_draft_tokens = 0;
  EXPECT_NO_THROW(ok.validate());
  EXPECT_EQ(speculative_draft_tokens(ok), 7);
  ok.speculative_num_steps = 1;  // a tree of 4 candidates: all of them by default
  EXPECT_NO_THROW(ok.validate());
  EXPECT_EQ(speculative_draft_tokens(ok), 4);
}

}  // namespace
}  // namespace servetune
