// Speculative decoding (ngram, draft model, DeepSeek MTP) end to end on real models: greedy outputs (tokens, text, finish
// reasons, including stop strings and max_tokens cut inside a burst) are identical with and without speculation at
// concurrency 1 and 32 with chunked prefill and prefix caching on; drafts are accepted, bursts arrive as one event,
// no KV leaks (target or draft cache); sampled outputs keep their distribution; bad draft models are clear errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "model/make_model.h"
#include "model/model_config.h"
#include "runtime/draft_speculator.h"
#include "speculative_checks.h"
#include "servetune/engine.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

// A copy of stories260K with every layer weight scaled by a random factor around 1 (seeded): a draft model with
// the same vocabulary that agrees with the target often but not always, so rejections and rollbacks happen.
std::string perturbed_stories(double spread) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("servetune_draft_" + std::to_string(getpid()) + "_" + std::to_string(spread) + ".gguf")).string();
  std::ifstream in(testing::stories_path(), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::pair<size_t, int64_t>> spans;  // (byte offset, elements) of the f32 layer tensors
  {
    GgufFile file(bytes, "stories260K copy");
    for (const auto& t : file.tensors()) {
      if (t.name.rfind("blk.", 0) == 0 && t.dtype == DType::kF32) spans.emplace_back(file.data_offset() + t.offset, t.n_elements());
    }
  }
  std::mt19937_64 rng(42);
  std::normal_distribution<float> noise(1.0f, static_cast<float>(spread));
  for (const auto& [offset, count] : spans) {
    auto* w = reinterpret_cast<float*>(bytes.data() + offset);
    for (int64_t i = 0; i < count; ++i) w[i] *= noise(rng);
  }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

TEST(EngineSpeculative, Stories260KGreedyIdenticalWithNgram) { check_model(testing::stories_path(), kStoriesTexts, 64, 80, kNgram); }

TEST(EngineSpeculative, SmolLM2GreedyIdenticalWithNgram) { check_model(testing::smollm2_path(), kSmolTexts, 40, 48, kNgram); }

// Drafts verified on a mixture-of-experts model with a latent cache (rollback of rejected drafts included).
TEST(EngineSpeculative, DeepSeekV3TinyGreedyIdenticalWithNgram) {
  check_model(testing::data_path("gguf_moe/deepseek_v3_tiny.gguf"), kStoriesTexts, 32, 40, kNgram);
}

// The target as its own draft: every greedy draft should be accepted (a test that fails if drafts and
// verification disagree on positions, KV or rollback).
TEST(EngineSpeculative, Stories260KGreedyIdenticalWithItselfAsDraft) {
  check_model(testing::stories_path(), kStoriesTexts, 64, 80, {"draft", testing::stories_path(), 0.9});
}

// A perturbed copy as draft: many rejections, so the draft KV is rolled back all the time; still identical.
TEST(EngineSpeculative, Stories260KGreedyIdenticalWithPerturbedDraft) {
  const std::string draft = perturbed_stories(0.05);
  check_model(testing::stories_path(), kStoriesTexts, 64, 80, {"draft", draft, 0.0});
  std::filesystem::remove(draft);
}

TEST(EngineSpeculative, SmolLM2GreedyIdenticalWithItselfAsDraft) {
  check_model(testing::smollm2_path(), kSmolTexts, 40, 48, {"draft", testing::smollm2_path(), 0.9});
}

// DeepSeek-V3's MTP layer (trained by scripts/gen_mtp_goldens.py to predict the target's greedy continuations) as the
// draft head: one step (the study's setting) and three chained steps, SGLang's spelling EAGLE for the latter. The
// step loop hands it the target's hidden states through chunked prefill, verification rollbacks, preemption and
// prefix-cache hits.
TEST(EngineSpeculative, DeepSeekV3MtpGreedyIdenticalOneStep) {
  check_model(testing::data_path(kMtpModel), kStoriesTexts, 32, 40, {"mtp", "", 0.3, 1});
}
TEST(EngineSpeculative, DeepSeekV3MtpGreedyIdenticalThreeStepsAsEagle) {
  check_model(testing::data_path(kMtpModel), kStoriesTexts, 32, 40, {"EAGLE", "", 0.15, 3});
}
// An EAGLE head (random weights, scripts/gen_eagle_goldens.py) on a llama-family target: it rarely agrees with the
// target, so this checks identity through rejections and the hidden-state hand-over of a dense model, chained 3 deep.
TEST(EngineSpeculative, Stories260KGreedyIdenticalWithRandomEagleHead) {
  check_model(testing::stories_path(), kStoriesTexts, 64, 80, {"EAGLE", testing::data_path(kStoriesHead), -1.0, 3});
}
// The EAGLE head scripts/train_eagle_head.py trained on SmolLM2's own ShareGPT answers: drafts get accepted.
TEST(EngineSpeculative, SmolLM2GreedyIdenticalWithTrainedEagleHead) {
  SERVETUNE_REQUIRE_FILE(testing::data_path("eagle/smollm2_head/model.safetensors"));
  check_model(testing::smollm2_path(), kSmolTexts, 40, 48, {"EAGLE", testing::data_path("eagle/smollm2_head"), 0.1, 2});
}

// A draft vocabulary file (a JSON array) of the ids below `vocab` divisible by `every`, in a temporary file.
std::string token_map_file(int64_t vocab, int every, const std::string& tag) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("servetune_token_map_" + std::to_string(getpid()) + "_" + tag + ".json")).string();
  std::ofstream out(path);
  out << "[";
  for (int64_t t = 0; t < vocab; t += every) out << (t > 0 ? ", " : "") << t;
  out << "]\n";
  return path;
}

// Draft heads on a draft vocabulary (speculative_token_map): every other token can never be drafted, so the head's
// best token is often outside it; outputs stay identical, chained drafts and rollbacks included.
TEST(EngineSpeculative, Stories260KGreedyIdenticalWithRandomEagleHeadOnADraftVocabulary) {
  const std::string map = token_map_file(512, 2, "stories");
  Spec spec{"EAGLE", testing::data_path(kStoriesHead), -1.0, 3};
  spec.token_map = map;
  check_model(testing::stories_path(), kStoriesTexts, 64, 80, spec);
  std::filesystem::remove(map);
}
// ... and with the MTP layer's float weights stored as Q8_0 (speculative_draft_model_quantization).
TEST(EngineSpeculative, DeepSeekV3MtpGreedyIdenticalOnADraftVocabularyWithQ8_0Weights) {
  const std::string map = token_map_file(320, 2, "mtp");
  Spec spec{"mtp", "", 0.05, 2};
  spec.token_map = map;
  spec.q8_0 = true;
  check_model(testing::data_path(kMtpModel), kStoriesTexts, 32, 40, spec);
  std::filesystem::remove(map);
}
// The trained SmolLM2 head with the draft vocabulary it was trained on (scripts/train_eagle_head.py's token_map.json).
TEST(EngineSpeculative, SmolLM2GreedyIdenticalWithTrainedEagleHeadAndTokenMap) {
  SERVETUNE_REQUIRE_FILE(testing::data_path("eagle/smollm2_head/token_map.json"));
  Spec spec{"EAGLE", testing::data_path("eagle/smollm2_head"), 0.1, 2};
  spec.token_map = testing::data_path("eagle/smollm2_head/token_map.json");
  check_model(testing::smollm2_path(), kSmolTexts, 40, 48, spec);
}

// Steps with 8 or more decoding requests draft nothing, while the head keeps catching up on the target's states.
TEST(EngineSpeculative, DeepSeekV3MtpGreedyIdenticalWhenDisabledByBatchSize) {
  check_model(testing::data_path(kMtpModel), kStoriesTexts, 32, 40, {"mtp", "", 0.2, 2, 8});
}

TEST(EngineSpeculative, Stories260KSampledDistributionUnchanged) { check_sampled_distribution(kNgram); }

// Draft tokens drawn from the draft model's distribution q, verified with min(1, p/q) and the residual max(0, p - q).
TEST(EngineSpeculative, Stories260KSampledDistributionUnchangedWithDraftModel) {
  const std::string draft = perturbed_stories(0.05);
  check_sampled_distribution({"draft", draft, 0.0});
  std::filesystem::remove(draft);
}

// EAGLE drafts drawn from a random head's q, chained over two steps.
TEST(EngineSpeculative, Stories260KSampledDistributionUnchangedWithEagleHead) {
  check_sampled_distribution({"EAGLE", testing::data_path(kStoriesHead), 0.0, 2});
}

// Drafts drawn from a q that is 0 outside a draft vocabulary of half the tokens: still the target's distribution.
TEST(EngineSpeculative, Stories260KSampledDistributionUnchangedWithEagleHeadOnADraftVocabulary) {
  const std::string map = token_map_file(512, 2, "stories_sampled");
  Spec spec{"EAGLE", testing::data_path(kStoriesHead), 0.0, 2};
  spec.token_map = map;
  check_sampled_distribution(spec);
  std::filesystem::remove(map);
}

// MTP drafts drawn from the head's q, chained over two steps.
TEST(EngineSpeculative, DeepSeekV3MtpSampledDistributionUnchanged) {
  check_sampled_distribution({"mtp", "", 0.0, 2}, testing::data_path(kMtpModel));
}

// Draft KV rollback, property test on the draft speculator alone: random requests, drafts, verifications (a random
// number of drafts kept, then a token the draft did not propose), preemptions and finishes. The draft cache never
// leaks a block, stays consistent, and its greedy drafts always equal those of a fresh speculator given the same
// tokens (so no stale K/V of a rejected draft survives a rollback).
TEST(DraftSpeculatorRollback, NoLeaksAndNoStaleKvUnderRandomSteps) {
  SERVETUNE_REQUIRE_FILE(testing::stories_path());
  Engine target(config(testing::stories_path(), kNoSpec));
  auto backend = make_backend("cpu", 2);
  SpeculatorContext ctx;
  ctx.backend = backend.get();
  ctx.target_tokenizer = &target.tokenizer();
  ctx.target_vocab = target.model_config().vocab;
  ctx.kv_tokens = 1024;
  ctx.page_size = 8;
  ctx.max_batch_tokens = 48;  // prompt catch-up in several chunks
  DraftModelSpeculator spec(testing::stories_path(), testing::stories_path(), ctx);
  DraftModelSpeculator fresh(testing::stories_path(), testing::stories_path(), ctx);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::mt19937_64 rng(7);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const auto vocab = static_cast<int32_t>(ctx.target_vocab);
  std::map<int64_t, std::vector<int32_t>> live;  // seq id -> tokens
  int64_t next_id = 0, rejected = 0;
  for (int step = 0; step < 300; ++step) {
    while (live.size() < 6) {
      std::vector<int32_t> prompt = {1};
      for (int64_t i = uni(1, 60); i > 0; --i) prompt.push_back(static_cast<int32_t>(uni(3, vocab - 1)));
      live[next_id++] = prompt;
    }
    std::vector<DraftSlot> slots;
    std::vector<std::vector<int32_t>> drafts(live.size());
    std::vector<std::vector<float>> probs(live.size());
    size_t i = 0;
    for (auto& [id, tokens] : live) {
      if (uni(0, 3) != 0) slots.push_back({id, tokens, uni(1, 5), &greedy, 0, &drafts[i], &probs[i]});
      ++i;
    }
    spec.propose(slots);
    for (const DraftSlot& slot : slots) {
      ASSERT_EQ(static_cast<int64_t>(slot.draft->size()), slot.max_tokens);
      ASSERT_TRUE(slot.draft_probs->empty()) << "greedy drafts are deterministic";
      std::vector<int32_t> ref_draft;
      std::vector<float> ref_probs;
      DraftSlot ref = slot;
      ref.draft = &ref_draft;
      ref.draft_probs = &ref_probs;
      fresh.propose(std::span<const DraftSlot>(&ref, 1));
      fresh.release(slot.seq_id);
      ASSERT_EQ(*slot.draft, ref_draft) << "step " << step << ", sequence " << slot.seq_id;
      // Verification: keep a random number of drafts, then a token that differs from the next draft.
      auto& tokens = live[slot.seq_id];
      const int64_t keep = uni(0, static_cast<int64_t>(slot.draft->size()));
      tokens.insert(tokens.end(), slot.draft->begin(), slot.draft->begin() + keep);
      int32_t next = static_cast<int32_t>(uni(3, vocab - 1));
      if (keep < static_cast<int64_t>(slot.draft->size()) && next == (*slot.draft)[static_cast<size_t>(keep)]) {
        next = next == vocab - 1 ? 3 : next + 1;  // a rejection: the target's token differs from the draft
      }
      tokens.push_back(next);
      rejected += static_cast<int64_t>(slot.draft->size()) - keep;
      spec.rollback(slot.seq_id, tokens);
    }
    // Finishes, aborts and preemptions all release the request's draft state.
    for (auto it = live.begin(); it != live.end();) {
      if (uni(0, 9) == 0 || it->second.size() > 200) {
        spec.release(it->first);
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    ASSERT_TRUE(spec.blocks().check_invariants()) << "step " << step;
    int64_t needed = 0;
    for (const auto& [id, tokens] : live) needed += (static_cast<int64_t>(tokens.size()) + ctx.page_size - 1) / ctx.page_size;
    ASSERT_LE(spec.kv_blocks_used(), needed) << "draft blocks beyond the live tokens (step " << step << ")";
  }
  for (const auto& [id, tokens] : live) spec.release(id);
  EXPECT_EQ(spec.kv_blocks_used(), 0);
  EXPECT_EQ(spec.num_tracked(), 0u);
  EXPECT_EQ(fresh.kv_blocks_used(), 0);
  EXPECT_GT(rejected, 100);
}

// Engine level: random submits and aborts with a draft model never leak a draft (or target) KV block.
TEST(EngineSpeculative, DraftModelAbortsLeakNoBlocks) {
  SERVETUNE_REQUIRE_FILE(testing::stories_path());
  EngineConfig c = config(testing::stories_path(), {"draft", testing::stories_path(), 0.0});
  c.max_total_tokens = 1024;
  c.page_size = 8;
  Engine engine(c);
  std::mt19937_64 rng(3);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 48; ++i) {
    Request r;
    r.prompt = kStoriesTexts[static_cast<size_t>(i) % kStoriesTexts.size()];
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.8f;
    r.sampling.max_tokens = 20 + i % 30;
    r.sampling.seed = static_cast<uint64_t>(i);
    streams.push_back(engine.submit(r));
    if (rng() % 3 == 0) engine.abort(streams[rng() % streams.size()]->id());
  }
  for (auto& st : streams) {
    while (auto e = st->next()) {
      EXPECT_NE(e->finish, FinishReason::kError) << e->error;
      if (e->finish != FinishReason::kNone) break;
    }
  }
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.running + s.waiting, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.spec_draft_kv_blocks_used, 0);
  EXPECT_GT(s.requests_aborted, 0);
  EXPECT_GT(s.spec_accepted_tokens, 0);
}

// The error an engine with `c` stops with (bad settings and models: one clear message naming the input).
std::string error_of(const EngineConfig& c) {
  try {
    Engine engine(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// EAGLE / MTP without a head on a model without a multi-token-prediction layer, MTP with a draft model, and tree
// drafts from a draft model (chains only): clear errors naming what to do.
TEST(EngineSpeculative, UnimplementedAlgorithmsAreClearErrors) {
  for (const char* algo : {"eagle", "mtp", "EAGLE"}) {
    EngineConfig c = config(testing::stories_path(), kNoSpec);
    c.speculative_algorithm = parse_speculative_algorithm(algo);
    try {
      Engine engine(c);
      ADD_FAILURE() << algo << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << algo;
      EXPECT_NE(std::string(e.what()).find("--speculative-draft-model DIR"), std::string::npos) << e.what();
    }
  }
  struct Bad {
    std::string algorithm, draft;
    int topk;
    ErrorKind kind;
    std::string says;
  };
  for (const Bad& b : {Bad{"draft", testing::stories_path(), 2, ErrorKind::kUnsupported, "implemented for the eagle and mtp"},
                       Bad{"mtp", testing::stories_path(), 1, ErrorKind::kUsage, "takes no draft model"}}) {
    EngineConfig c = config(testing::data_path(kMtpModel), {b.algorithm, "", 0.0, 2});
    c.speculative_eagle_topk = b.topk;
    c.speculative_draft_model = b.draft;
    try {
      c.validate();
      ADD_FAILURE() << b.algorithm << " topk " << b.topk << ", draft '" << b.draft << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), b.kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(b.says), std::string::npos) << e.what();
    }
  }
  EngineConfig c = config(testing::stories_path(), kNoSpec);
  c.speculative_num_draft_tokens = 3;  // without an algorithm
  EXPECT_THROW(c.validate(), Error);
  c = config(testing::stories_path(), kNgram);
  c.speculative_ngram_min_match_window_size = 5;  // > max (4)
  EXPECT_THROW(c.validate(), Error);
  c = config(testing::stories_path(), kNgram);
  c.speculative_num_steps = 2;  // not an ngram setting
  EXPECT_THROW(c.validate(), Error);
  c = config(testing::stories_path(), kNgram);
  c.speculative_token_map = "hot.json";  // a draft head's setting
  try {
    c.validate();
    ADD_FAILURE() << "a token map with ngram speculation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("speculative_token_map"), std::string::npos) << e.what();
  }
  c = config(testing::stories_path(), kNgram);
  c.speculative_draft_model_quantization = DraftModelQuantization::kQ8_0;  // a draft head's setting too
  EXPECT_THROW(c.validate(), Error);
  c = config(testing::stories_path(), kNgram);
  EXPECT_NO_THROW(c.validate());
  // A token map the engine cannot read, or with an id past the target's vocabulary, names the file.
  Spec eagle{"EAGLE", testing::data_path(kStoriesHead), 0.0, 2};
  eagle.token_map = "/nonexistent/hot.json";
  c = config(testing::stories_path(), eagle);
  EXPECT_NE(error_of(c).find("/nonexistent/hot.json: cannot be read"), std::string::npos) << error_of(c);
  eagle.token_map = token_map_file(1024, 1, "too_big");
  c = config(testing::stories_path(), eagle);
  EXPECT_NE(error_of(c).find("token id 512 is outside the target's vocabulary [0, 512)"), std::string::npos) << error_of(c);
  std::filesystem::remove(eagle.token_map);
}

TEST(EngineSpeculative, DraftModelBadInputsAreClearErrors) {
  SERVETUNE_REQUIRE_FILE(testing::stories_path());
  EngineConfig c = config(testing::stories_path(), {"draft", "", 0.0});
  EXPECT_NE(error_of(c).find("--speculative-draft-model"), std::string::npos) << error_of(c);

  c = config(testing::stories_path(), {"draft", "/nonexistent/draft.gguf", 0.0});
  EXPECT_NE(error_of(c).find("/nonexistent/draft.gguf"), std::string::npos) << error_of(c);

  // SGLang's rule: num_draft_tokens = num_steps + 1; either alone is fine.
  c = config(testing::stories_path(), {"draft", testing::stories_path(), 0.0});
  c.speculative_num_draft_tokens = 4;  // num_steps is 4
  EXPECT_NE(error_of(c).find("speculative_num_steps + 1"), std::string::npos) << error_of(c);
  c.speculative_num_draft_tokens = 5;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(speculative_draft_tokens(c), 4);
  c.speculative_num_steps = 0;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(speculative_draft_tokens(c), 4);
  c.speculative_num_draft_tokens = 0;
  EXPECT_EQ(speculative_draft_tokens(c), 4) << "the default";
  c.speculative_num_draft_tokens = 1;
  EXPECT_THROW(c.validate(), Error) << "no draft token left";
  c.speculative_num_draft_tokens = 5;
  c.speculative_eagle_topk = 4;
  EXPECT_THROW(c.validate(), Error);

  // A draft with another vocabulary (a random byte-level model): named, both files.
  const auto dir = std::filesystem::temp_directory_path() / ("servetune_draft_vocab_" + std::to_string(getpid()));
  write_random_model(model_preset("tiny"), dir.string(), 1, DType::kF32, 0.02f);
  c = config(testing::stories_path(), {"draft", dir.string(), 0.0});
  const std::string msg = error_of(c);
  EXPECT_NE(msg.find("vocabular"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find(testing::stories_path()), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace servetune
