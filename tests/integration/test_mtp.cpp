// DeepSeek-V3's multi-token-prediction layer as a draft head: its logits and hidden states match the transformers-built
// reference of scripts/gen_mtp_goldens.py (given the target's hidden states, in one pass and token by token through
// the paged cache); the target returns its final hidden states (Batch::return_hidden) as transformers computes them;
// and the MTP speculator's cache stays consistent under random drafts, verifications, rollbacks and releases.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "model/checkpoint.h"
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

const std::string kModel = "hf_models/deepseek_v3_mtp_tiny";

const nlohmann::json& goldens() {
  static const nlohmann::json doc = [] {
    std::ifstream in(testing::data_path("hf_models/mtp_logits.json"));
    return nlohmann::json::parse(in);
  }();
  return doc;
}

TEST(MtpLayer, LogitsAndHiddenMatchTransformers) {
  SERVETUNE_REQUIRE_FILE(testing::data_path(kModel + "/model.safetensors"));
  Checkpoint ck(testing::data_path(kModel), LoadFormat::kSafetensors);
  ASSERT_EQ(ck.config().nextn_layers, 1);
  auto backend = make_backend("cpu", 2);
  auto target = ck.load(*backend, ParallelContext{});
  auto mtp = ck.load_next_n(*backend);
  ASSERT_EQ(mtp->config().n_layers, 1);
  const int64_t page = 4, blocks = 8;
  for (const auto& c : goldens().at("cases")) {
    const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
    const auto hidden = c.at("hidden").get<std::vector<std::vector<float>>>();
    const int n = static_cast<int>(tokens.size());
    // The target's final hidden states at positions 0 .. n-2, which the golden's MTP inputs are.
    expect_hidden_states(*target, *backend, tokens, hidden, page, blocks, "target hidden states");
    // The MTP layer: position i reads t_{i+1} and h_i.
    const std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
    const auto expected = c.at("logits").get<std::vector<std::vector<float>>>();
    const auto expected_hidden = c.at("mtp_hidden").get<std::vector<std::vector<float>>>();
    const int m = n - 1;
    const std::vector<float> h = flat_rows(hidden);
    {
      KvStorage kv(*backend, mtp->config(), mtp->local_kv_heads(), blocks, page, DType::kF32);
      Batch b = one_sequence(next, 0, m, page, blocks);
      b.input_hidden = h;
      b.return_hidden = true;
      std::vector<float> logits;
      mtp->forward(b, kv, logits);
      expect_rows_close(logits, expected, 0, "MTP one pass");
      const auto g = mtp->hidden_rows();
      expect_rows_close(std::vector<float>(g.begin(), g.end()), expected_hidden, 0, "MTP hidden");
      const auto argmax = c.at("argmax").get<std::vector<int32_t>>();
      for (int i = 0; i < m; ++i) {
        const auto row = logits.begin() + static_cast<long>(i * mtp->config().vocab);
        EXPECT_EQ(std::max_element(row, row + mtp->config().vocab) - row, argmax[static_cast<size_t>(i)]);
      }
    }
    {  // token by token through the paged latent cache
      KvStorage kv(*backend, mtp->config(), mtp->local_kv_heads(), blocks, page, DType::kF32);
      for (int i = 0; i < m; ++i) {
        Batch b = one_sequence(next, i, i + 1, page, blocks);
        b.input_hidden.assign(h.begin() + static_cast<long>(i * hidden[0].size()), h.begin() + static_cast<long>((i + 1) * hidden[0].size()));
        std::vector<float> logits;
        mtp->forward(b, kv, logits);
        expect_rows_close(logits, expected, static_cast<size_t>(i), "MTP decode");
      }
    }
  }
}

TEST(MtpLayer, ModelWithoutOneIsAClearError) {
  SERVETUNE_REQUIRE_FILE(testing::data_path("hf_models/deepseek_v3_tiny/model.safetensors"));
  Checkpoint ck(testing::data_path("hf_models/deepseek_v3_tiny"), LoadFormat::kSafetensors);
  auto backend = make_backend("cpu", 1);
  try {
    ck.load_next_n(*backend);
    ADD_FAILURE() << "a model without MTP layers loaded one";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("deepseek_v3_tiny"), std::string::npos) << e.what();
  }
}

// A target stand-in: h_i depends on position i and token t_i only (deterministic), so a fresh speculator given the
// whole history must draft exactly what one fed step by step does, if rollbacks drop every rejected position.
std::vector<float> fake_hidden(int64_t position, int32_t token, int64_t width) {
  std::mt19937_64 rng(static_cast<uint64_t>(position) * 1000003u + static_cast<uint64_t>(token));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(width));
  for (float& v : row) v = normal(rng);
  return row;
}

std::vector<float> fake_rows(const std::vector<int32_t>& tokens, int64_t begin, int64_t end, int64_t width) {
  std::vector<float> out;
  for (int64_t p = begin; p < end; ++p) {
    const auto r = fake_hidden(p, tokens[static_cast<size_t>(p)], width);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

// A draft head's context on `backend` for the target `ck`, with pages of 8 tokens.
SpeculatorContext head_context(const Checkpoint& ck, Backend& backend, int64_t kv_tokens, bool prefix_caching) {
  SpeculatorContext ctx;
  ctx.backend = &backend;
  ctx.kv_tokens = kv_tokens;
  ctx.page_size = 8;
  ctx.target = &ck;
  ctx.target_hidden = true;
  ctx.prefix_caching = prefix_caching;
  return ctx;
}

TEST(DraftHeadSpeculatorRollback, DraftsEqualAFreshSpeculatorsUnderRandomSteps) {
  SERVETUNE_REQUIRE_FILE(testing::data_path(kModel + "/model.safetensors"));
  Checkpoint ck(testing::data_path(kModel), LoadFormat::kSafetensors);
  auto backend = make_backend("cpu", 2);
  SpeculatorContext ctx = head_context(ck, *backend, 2048, false);
  ctx.max_batch_tokens = 24;  // prompt catch-up in several chunks
  const int64_t width = ck.config().hidden, vocab = ck.config().vocab;
  DraftHeadSpeculator spec(ck.load_next_n(*backend), ctx, DraftTreeShape{3, 1, 3}, "mtp");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::mt19937_64 rng(7);
  std::map<int64_t, std::vector<int32_t>> live;  // seq id -> tokens
  int64_t next_id = 1, checked = 0, accepted = 0;
  for (int round = 0; round < 60; ++round) {
    if (live.size() < 4) {  // a new request: its prompt's states arrive (in two chunks), as prefill gives them
      std::vector<int32_t> prompt(static_cast<size_t>(2 + rng() % 40));
      for (int32_t& t : prompt) t = static_cast<int32_t>(3 + rng() % static_cast<uint64_t>(vocab - 3));
      const int64_t id = next_id++;
      const auto n = static_cast<int64_t>(prompt.size());
      const int64_t half = (n - 1) / 2;
      spec.target_hidden(id, 0, fake_rows(prompt, 0, half, width));
      spec.target_hidden(id, half, fake_rows(prompt, half, n - 1, width));
      live[id] = prompt;
    }
    std::vector<int64_t> ids;
    std::vector<std::vector<int32_t>> drafts(live.size()), probs(live.size());
    std::vector<std::vector<float>> q(live.size());
    std::vector<DraftSlot> slots;
    size_t k = 0;
    for (auto& [id, tokens] : live) {
      slots.push_back({id, tokens, 1 + static_cast<int64_t>(rng() % 3), &greedy, 0, &drafts[k], &q[k]});
      ids.push_back(id);
      ++k;
    }
    spec.propose(slots);
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<int32_t>& tokens = live[ids[i]];
      const std::vector<int32_t>& d = drafts[i];
      ASSERT_FALSE(d.empty());
      {  // a fresh speculator given the whole history drafts the same
        DraftHeadSpeculator fresh(ck.load_next_n(*backend), ctx, DraftTreeShape{3, 1, 3}, "mtp");
        const auto n = static_cast<int64_t>(tokens.size());
        fresh.target_hidden(ids[i], 0, fake_rows(tokens, 0, n - 1, width));
        std::vector<int32_t> fd;
        std::vector<float> fq;
        DraftSlot s{ids[i], tokens, slots[i].max_tokens, &greedy, 0, &fd, &fq};
        fresh.propose(std::span<const DraftSlot>(&s, 1));
        EXPECT_EQ(fd, d) << "request " << ids[i] << " at " << n << " tokens";
        ++checked;
      }
      // Verification: the target computes positions n-1 .. n-1+len(d) (their states from the drafts), keeps a random
      // number of drafts and emits one token of its own; the rejected positions' states must go.
      const auto n = static_cast<int64_t>(tokens.size());
      std::vector<int32_t> verified = tokens;
      verified.insert(verified.end(), d.begin(), d.end());
      spec.target_hidden(ids[i], n - 1, fake_rows(verified, n - 1, n + static_cast<int64_t>(d.size()), width));
      const auto keep = static_cast<size_t>(rng() % (d.size() + 1));
      accepted += static_cast<int64_t>(keep);
      tokens.insert(tokens.end(), d.begin(), d.begin() + static_cast<long>(keep));
      int32_t own = static_cast<int32_t>(3 + rng() % static_cast<uint64_t>(vocab - 3));
      if (keep < d.size() && own == d[keep]) own = own == 3 ? 4 : 3;  // a rejection emits another token
      tokens.push_back(own);
      spec.rollback(ids[i], tokens);
    }
    if (rng() % 4 == 0) {  // a request finishes (or is preempted)
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      spec.release(it->first);
      live.erase(it);
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(accepted, 20);
  for (const auto& [id, tokens] : live) spec.release(id);
  EXPECT_EQ(spec.num_tracked(), 0u);
  EXPECT_EQ(spec.blocks().num_used_blocks(), 0);
  EXPECT_EQ(spec.positions_without_hidden(), 0);
}

// Prefix caching: a request whose target reused a cached prefix hands over states only from there on; the head's own
// cache holds the rows an earlier request with that prefix computed, so nothing runs without a state and the drafts
// are those of a head given every state. Rows computed without a state are never shared.
TEST(DraftHeadSpeculatorPrefixCache, ACachedPrefixNeedsNoStatesItDidNotGet) {
  SERVETUNE_REQUIRE_FILE(testing::data_path(kModel + "/model.safetensors"));
  Checkpoint ck(testing::data_path(kModel), LoadFormat::kSafetensors);
  auto backend = make_backend("cpu", 2);
  const SpeculatorContext ctx = head_context(ck, *backend, 512, true);
  const int64_t width = ck.config().hidden;
  DraftHeadSpeculator spec(ck.load_next_n(*backend), ctx, DraftTreeShape{2, 1, 2}, "mtp");
  DraftHeadSpeculator fresh(ck.load_next_n(*backend), ctx, DraftTreeShape{2, 1, 2}, "mtp");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<int32_t> shared(40);
  for (size_t i = 0; i < shared.size(); ++i) shared[i] = static_cast<int32_t>(3 + (i * 37) % 300);
  const auto propose = [&](DraftHeadSpeculator& s, int64_t id, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> draft;
    std::vector<float> q;
    const DraftSlot slot{id, tokens, 2, &greedy, 0, &draft, &q};
    s.propose(std::span<const DraftSlot>(&slot, 1));
    return draft;
  };
  // Request 1 computes the whole prompt and finishes; its full blocks stay cached.
  std::vector<int32_t> a = shared;
  a.push_back(7);
  spec.target_hidden(1, 0, fake_rows(a, 0, static_cast<int64_t>(a.size()) - 1, width));
  propose(spec, 1, a);
  spec.release(1);
  // Request 2 shares 40 tokens; its target reused 32 of them (4 blocks) and computed the rest.
  std::vector<int32_t> b = shared;
  for (int32_t t : {11, 12, 13, 14}) b.push_back(t);
  const auto n = static_cast<int64_t>(b.size());
  spec.target_hidden(2, 32, fake_rows(b, 32, n - 1, width));
  const std::vector<int32_t> got = propose(spec, 2, b);
  EXPECT_EQ(spec.positions_without_hidden(), 0);
  fresh.target_hidden(2, 0, fake_rows(b, 0, n - 1, width));
  EXPECT_EQ(got, propose(fresh, 2, b));
  spec.release(2);
  // Request 3's target reused more than the head has: its first rows run without states and are not shared on.
  std::vector<int32_t> c(shared.begin(), shared.begin() + 16);
  for (int32_t t = 100; t < 140; ++t) c.push_back(t);
  spec.flush_cache();
  spec.target_hidden(3, 16, fake_rows(c, 16, static_cast<int64_t>(c.size()) - 1, width));
  propose(spec, 3, c);
  EXPECT_EQ(spec.positions_without_hidden(), 16);
  spec.release(3);
  spec.target_hidden(4, 0, fake_rows(c, 0, static_cast<int64_t>(c.size()) - 1, width));
  const std::vector<int32_t> again = propose(spec, 4, c);
  EXPECT_EQ(spec.positions_without_hidden(), 16);  // request 4 computed its own rows, none reused from request 3
  fresh.release(2);
  fresh.target_hidden(4, 0, fake_rows(c, 0, static_cast<int64_t>(c.size()) - 1, width));
  EXPECT_EQ(again, propose(fresh, 4, c));
  spec.release(4);
  EXPECT_EQ(spec.blocks().num_used_blocks(), 0);
}

}  // namespace
}  // namespace servetune
