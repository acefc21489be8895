// Tensor-parallel logits against one rank: three prompts run in lockstep on several TensorParallelGroups (chunked
// prefill of 8 tokens a step, then greedy decoding on tp 1's picks), every logits row within 1e-5 relative of tp 1's
// and with the same greedy pick.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "model/batch.h"
#include "runtime/tensor_parallel_group.h"

namespace servetune::testing {

constexpr int64_t kPage = 16;
constexpr int64_t kLogitsMaxBlocks = 6;
constexpr int64_t kLogitsKvBlocks = 3 * kLogitsMaxBlocks;  // KV blocks each group needs

struct SeqState {
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  int64_t computed = 0;
  int32_t first_block = 0;
};

// The next step of `seqs`: up to `chunk` uncomputed tokens of each; sequences reaching their end sample.
inline Batch next_batch(const std::vector<SeqState>& seqs, int64_t chunk, int64_t max_blocks) {
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


// Runs three prompts on groups[0] (tp 1) and every other group in lockstep, feeding all the tokens groups[0] picks,
// and checks every logits row against its; `names` label the groups. Each group must have create_kv(kLogitsKvBlocks,
// kPage, DType::kF32) done.
inline void expect_groups_match(const std::string& model, const std::vector<TensorParallelGroup*>& groups,
                                const std::vector<std::string>& names) {
  const int64_t vocab = groups[0]->model(0).config().vocab;
  constexpr int64_t kMaxBlocks = kLogitsMaxBlocks;
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
      ASSERT_EQ(logits[g].size(), ref.size()) << names[g];
      for (size_t row = 0; row < batch.logits_indices.size(); ++row) {
        float scale = 0.0f, diff = 0.0f;
        for (int64_t v = 0; v < vocab; ++v) {
          const size_t at = row * static_cast<size_t>(vocab) + static_cast<size_t>(v);
          scale = std::max(scale, std::fabs(ref[at]));
          diff = std::max(diff, std::fabs(ref[at] - logits[g][at]));
        }
        const double rel = diff / std::max(scale, 1e-30f);
        worst = std::max(worst, rel);
        EXPECT_LE(rel, 1e-5) << model << " " << names[g] << " step " << step << " row " << row;
        const auto pick = [&](const std::vector<float>& l) {
          const auto first = l.begin() + static_cast<std::ptrdiff_t>(row * static_cast<size_t>(vocab));
          return std::max_element(first, first + vocab) - first;
        };
        EXPECT_EQ(pick(logits[g]), pick(ref)) << model << " " << names[g] << " greedy pick, step " << step << " row " << row;
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

}  // namespace servetune::testing
