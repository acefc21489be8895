// EAGLE draft heads (EAGLE-2's layout): a random head for stories260K (scripts/gen_eagle_goldens.py) gives
// transformers' logits and hidden states given the target's hidden states, in one pass and token by token; the
// target's returned hidden states match transformers'; with a draft vocabulary it scores only those tokens; the
// draft-head speculator chains its drafts as the reference does, and its draft trees expand each node as the head run
// on that node's path alone; heads that do not fit their target, and heads given as models, are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/eagle_head.h"
#include "model/kv_storage.h"
#include "model_batches.h"
#include "runtime/draft_head_speculator.h"
#include "test_paths.h"

namespace servetune {
namespace {

using testing::expect_hidden_states;
using testing::expect_rows_close;
using testing::flat_rows;
using testing::one_sequence;

const nlohmann::json& goldens() {
  static const nlohmann::json doc = [] {
    std::ifstream in(testing::data_path("eagle/eagle_logits.json"));
    return nlohmann::json::parse(in);
  }();
  return doc;
}

const std::string kHead = "eagle/stories260K_head";

// The head's logits for one sequence's `tokens` (its t_{i+1}) and the target's `hidden` rows, in one pass.
std::vector<float> head_logits(EagleHead& head, Backend& backend, const std::vector<int32_t>& tokens,
                               const std::vector<float>& hidden) {
  Model& m = head.model();
  const int64_t page = 4, blocks = 8;
  KvStorage kv(backend, m.config(), m.local_kv_heads(), blocks, page, DType::kF32);
  Batch b = one_sequence(tokens, 0, static_cast<int>(tokens.size()), page, blocks);
  b.input_hidden = hidden;
  std::vector<float> logits;
  m.forward(b, kv, logits);
  return logits;
}

TEST(EagleHead, LogitsAndHiddenMatchTransformers) {
  SERVETUNE_REQUIRE_FILE(testing::data_path(kHead + "/model.safetensors"));
  Checkpoint ck(testing::stories_path(), LoadFormat::kAuto);
  auto backend = make_backend("cpu", 2);
  auto target = ck.load(*backend, ParallelContext{});
  EagleHead head(testing::data_path(kHead), ck, *backend);
  Model& m = head.model();
  ASSERT_EQ(m.config().n_layers, 1);
  const int64_t page = 4, blocks = 8;
  for (const auto& c : goldens().at("cases")) {
    const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
    const auto hidden = c.at("hidden").get<std::vector<std::vector<float>>>();
    const int n = static_cast<int>(tokens.size());
    const size_t d = hidden[0].size();
    expect_hidden_states(*target, *backend, tokens, hidden, page, blocks, "target hidden");
    const std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
    const auto expected = c.at("logits").get<std::vector<std::vector<float>>>();
    const std::vector<float> h = flat_rows(hidden);
    {
      KvStorage kv(*backend, m.config(), m.local_kv_heads(), blocks, page, DType::kF32);
      Batch b = one_sequence(next, 0, n - 1, page, blocks);
      b.input_hidden = h;
      b.return_hidden = true;
      std::vector<float> logits;
      m.forward(b, kv, logits);
      expect_rows_close(logits, expected, 0, "EAGLE head one pass");
      const auto g = m.hidden_rows();
      expect_rows_close(std::vector<float>(g.begin(), g.end()), c.at("head_hidden").get<std::vector<std::vector<float>>>(), 0,
                        "EAGLE head hidden");
    }
    {
      KvStorage kv(*backend, m.config(), m.local_kv_heads(), blocks, page, DType::kF32);
      for (int i = 0; i + 1 < n; ++i) {
        Batch b = one_sequence(next, i, i + 1, page, blocks);
        b.input_hidden.assign(h.begin() + static_cast<long>(i * d), h.begin() + static_cast<long>((i + 1) * d));
        std::vector<float> logits;
        m.forward(b, kv, logits);
        expect_rows_close(logits, expected, static_cast<size_t>(i), "EAGLE head decode");
      }
    }
  }
}

// Three chained drafts through the speculator (its cache, the head's own hidden state fed back) are the reference's.
TEST(EagleHead, ChainedDraftsMatchTransformers) {
  SERVETUNE_REQUIRE_FILE(testing::data_path(kHead + "/model.safetensors"));
  Checkpoint ck(testing::stories_path(), LoadFormat::kAuto);
  auto backend = make_backend("cpu", 2);
  auto head = std::make_shared<EagleHead>(testing::data_path(kHead), ck, *backend);
  SpeculatorContext ctx;
  ctx.backend = backend.get();
  ctx.kv_tokens = 256;
  ctx.page_size = 4;
  ctx.max_batch_tokens = 5;  // catch-up in chunks
  DraftHeadSpeculator spec(std::shared_ptr<Model>(head, &head->model()), ctx, DraftTreeShape{3, 1, 3}, "eagle");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  int64_t id = 1;
  for (const auto& c : goldens().at("cases")) {
    const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
    spec.target_hidden(id, 0, flat_rows(c.at("hidden").get<std::vector<std::vector<float>>>()));
    std::vector<int32_t> draft;
    std::vector<float> q;
    const DraftSlot slot{id, tokens, 3, &greedy, 0, &draft, &q};
    spec.propose(std::span<const DraftSlot>(&slot, 1));
    EXPECT_EQ(draft, c.at("chain").at("tokens").get<std::vector<int32_t>>()) << "case " << id;
    spec.release(id++);
  }
  EXPECT_EQ(spec.blocks().num_used_blocks(), 0);
}

// A draft tree (topk 2, 3 steps, every candidate kept): the children of the root and of every expanded node are the
// top 2 of the head run on that node's path alone (each path's own cache, the head's hidden states chained), so the
// tree-masked draft steps see exactly their ancestors.
TEST(EagleHead, TreeChildrenAreTheTopKOfEachPathAlone) {
  SERVETUNE_REQUIRE_FILE(testing::data_path(kHead + "/model.safetensors"));
  Checkpoint ck(testing::stories_path(), LoadFormat::kAuto);
  auto backend = make_backend("cpu", 2);
  auto head = std::make_shared<EagleHead>(testing::data_path(kHead), ck, *backend);
  Model& m = head->model();
  SpeculatorContext ctx;
  ctx.backend = backend.get();
  ctx.kv_tokens = 256;
  ctx.page_size = 4;
  DraftHeadSpeculator spec(std::shared_ptr<Model>(head, &head->model()), ctx, DraftTreeShape{3, 2, 10}, "eagle");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto& c = goldens().at("cases").at(0);
  const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
  const std::vector<float> h = flat_rows(c.at("hidden").get<std::vector<std::vector<float>>>());
  spec.target_hidden(1, 0, h);
  std::vector<int32_t> draft, parents;
  std::vector<float> q;
  const DraftSlot slot{1, tokens, 10, &greedy, 0, &draft, &q, &parents};
  spec.propose(std::span<const DraftSlot>(&slot, 1));
  ASSERT_EQ(draft.size(), 10u);  // 2 + 2 x 2^2 candidates
  ASSERT_EQ(parents.size(), 10u);
  const auto vocab = static_cast<size_t>(m.config().vocab);
  const auto d = static_cast<size_t>(m.config().hidden);
  const int n = static_cast<int>(tokens.size());
  const auto top2 = [&](const std::vector<float>& logits, size_t row) {
    std::vector<int32_t> ids(vocab);
    for (size_t i = 0; i < vocab; ++i) ids[i] = static_cast<int32_t>(i);
    const float* l = logits.data() + row * vocab;
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    ids.resize(2);
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  // The head on the context, then on `path` one token at a time: the top 2 after the last.
  const auto children_of_path = [&](const std::vector<int32_t>& path) {
    std::vector<int32_t> seq(tokens.begin() + 1, tokens.end());
    seq.insert(seq.end(), path.begin(), path.end());
    KvStorage kv(*backend, m.config(), m.local_kv_heads(), 16, 4, DType::kF32);
    Batch b = one_sequence(seq, 0, n - 1, 4, 16);
    b.input_hidden = h;
    b.return_hidden = true;
    std::vector<float> logits;
    m.forward(b, kv, logits);
    size_t row = static_cast<size_t>(n - 2);
    for (size_t j = 0; j < path.size(); ++j) {
      const auto hidden = m.hidden_rows();
      std::vector<float> last(hidden.begin() + static_cast<long>(row * d), hidden.begin() + static_cast<long>((row + 1) * d));
      Batch step = one_sequence(seq, n - 1 + static_cast<int>(j), n + static_cast<int>(j), 4, 16);
      step.input_hidden = last;
      step.return_hidden = true;
      m.forward(step, kv, logits);
      row = 0;
    }
    return top2(logits, row);
  };
  for (int32_t node = -1; node < 10; ++node) {
    std::vector<int32_t> children;
    for (size_t i = 0; i < draft.size(); ++i) {
      if (parents[i] == node) children.push_back(draft[i]);
    }
    if (children.empty()) continue;  // a leaf, or a candidate the beam did not expand
    std::sort(children.begin(), children.end());
    std::vector<int32_t> path;
    for (int32_t a = node; a >= 0; a = parents[static_cast<size_t>(a)]) path.insert(path.begin(), draft[static_cast<size_t>(a)]);
    EXPECT_EQ(children, children_of_path(path)) << "node " << node << " at depth " << path.size();
  }
  spec.release(1);
  EXPECT_EQ(spec.blocks().num_used_blocks(), 0);
}

std::string error_of(const std::string& head_dir, const std::string& target) {
  Checkpoint ck(target, LoadFormat::kAuto);
  auto backend = make_backend("cpu", 1);
  try {
    EagleHead head(head_dir, ck, *backend);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  return "(accepted)";
}

// A draft vocabulary (every third token id): the head's logits are the whole head's at those ids and -inf elsewhere.
TEST(EagleHead, DraftVocabularyScoresOnlyItsTokens) {
  SERVETUNE_REQUIRE_FILE(testing::data_path(kHead + "/model.safetensors"));
  Checkpoint ck(testing::stories_path(), LoadFormat::kAuto);
  auto backend = make_backend("cpu", 2);
  const int64_t vocab = ck.config().vocab;
  std::vector<int32_t> hot;
  for (int32_t t = 1; t < vocab; t += 3) hot.push_back(t);
  EagleHead whole(testing::data_path(kHead), ck, *backend);
  EagleHead part(testing::data_path(kHead), ck, *backend, hot);
  const auto& c = goldens().at("cases").at(0);
  const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
  const std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
  const std::vector<float> hidden = flat_rows(c.at("hidden").get<std::vector<std::vector<float>>>());
  const std::vector<float> logits[2] = {head_logits(whole, *backend, next, hidden), head_logits(part, *backend, next, hidden)};
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) {
    const auto token = static_cast<int32_t>(i % static_cast<size_t>(vocab));
    if (std::binary_search(hot.begin(), hot.end(), token)) {
      EXPECT_NEAR(logits[1][i], logits[0][i], 1e-5f * (1.0f + std::fabs(logits[0][i]))) << "row " << i / vocab << " token " << token;
    } else {
      EXPECT_TRUE(std::isinf(logits[1][i]) && logits[1][i] < 0) << "row " << i / vocab << " token " << token;
    }
  }
}

// speculative_draft_model_quantization q8_0 on the trained SmolLM2 head (f16): its logits stay within Q8_0's rounding
// of the stored head's, and are not the same (the weights were quantized). Heads whose matrices are not whole Q8_0
// blocks (stories260K's: 172 columns) are refused, naming the tensor.
TEST(EagleHead, Q8_0WeightsStayCloseToTheStoredOnes) {
  const std::string dir = testing::data_path("eagle/smollm2_head");
  SERVETUNE_REQUIRE_FILE(dir + "/model.safetensors");
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  Checkpoint ck(testing::smollm2_path(), LoadFormat::kAuto);
  auto backend = make_backend("cpu", 2);
  EagleHead stored(dir, ck, *backend);
  EagleHead q8(dir, ck, *backend, {}, true);
  const std::vector<int32_t> tokens = {1, 4093, 314, 253, 1345, 28, 940, 30};
  std::vector<float> hidden(tokens.size() * static_cast<size_t>(ck.config().hidden));
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  const std::vector<float> logits[2] = {head_logits(stored, *backend, tokens, hidden), head_logits(q8, *backend, tokens, hidden)};
  ASSERT_EQ(logits[0].size(), logits[1].size());
  float scale = 0, diff = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    scale = std::max(scale, std::fabs(logits[0][i]));
    diff = std::max(diff, std::fabs(logits[1][i] - logits[0][i]));
  }
  EXPECT_GT(diff, 0.0f) << "the Q8_0 head computed exactly the stored head's logits: were its weights quantized?";
  EXPECT_LT(diff, 0.05f * scale) << "largest logit " << scale;
  Checkpoint stories(testing::stories_path(), LoadFormat::kAuto);
  try {
    EagleHead odd(testing::data_path(kHead), stories, *backend, {}, true);
    ADD_FAILURE() << "a head with 172-column matrices was quantized to Q8_0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("172 columns, not whole Q8_0 blocks"), std::string::npos) << e.what();
  }
}

TEST(EagleHead, BadHeadsAreClearErrors) {
  SERVETUNE_REQUIRE_FILE(testing::data_path(kHead + "/model.safetensors"));
  const std::string missing = testing::data_path("eagle/no_such_head");
  EXPECT_NE(error_of(missing, testing::stories_path()).find("no_such_head"), std::string::npos);
  // A whole model is not a head.
  const std::string model = testing::data_path("hf_models/llama_tiny");
  EXPECT_NE(error_of(model, testing::stories_path()).find("is not an EAGLE head"), std::string::npos);
  // A head trained for another target (stories260K's width 64, vocabulary 512 against DeepSeek's 320).
  const std::string other = error_of(testing::data_path(kHead), testing::data_path("hf_models/deepseek_v3_mtp_tiny"));
  EXPECT_NE(other.find("must be trained for this target"), std::string::npos) << other;
  // A head given as the model.
  try {
    Checkpoint ck(testing::data_path(kHead), LoadFormat::kAuto);
    ADD_FAILURE() << "an EAGLE head loaded as a model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--speculative-draft-model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune
