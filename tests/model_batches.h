// Batches for tests that drive a Model directly: one sequence's positions [begin, end) with logits for each,
// its KV blocks laid out in reverse so block tables are exercised; and the comparison of its logits (and hidden
// states) with a golden.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/kv_storage.h"
#include "model/model.h"

namespace servetune::testing {

inline Batch one_sequence(const std::vector<int32_t>& tokens, int begin, int end, int64_t page, int64_t blocks) {
  Batch b;
  for (int p = begin; p < end; ++p) {
    b.tokens.push_back(tokens[static_cast<size_t>(p)]);
    b.positions.push_back(p);
    b.seq_of_token.push_back(0);
    b.slot_mapping.push_back(static_cast<int32_t>((blocks - 1 - p / page) * page + p % page));  // blocks in reverse
    b.logits_indices.push_back(p - begin);
  }
  b.max_blocks_per_seq = blocks;
  for (int64_t i = 0; i < blocks; ++i) b.block_tables.push_back(static_cast<int32_t>(blocks - 1 - i));
  return b;
}

// Golden rows (one vector per position) as one flat [rows x width] vector, as Batch::input_hidden holds them.
inline std::vector<float> flat_rows(const std::vector<std::vector<float>>& rows) {
  std::vector<float> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

// Logits rows [n, vocab] against golden rows from `first_row` on, each within 1e-4 of that golden row's largest
// magnitude.
inline void expect_rows_close(const std::vector<float>& ours, const std::vector<std::vector<float>>& expected,
                              size_t first_row, const std::string& what) {
  const size_t vocab = expected[0].size();
  ASSERT_EQ(ours.size() % vocab, 0u) << what;
  for (size_t r = 0; r * vocab < ours.size(); ++r) {
    const auto& row = expected[first_row + r];
    float scale = 0.0f;
    for (float v : row) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < vocab; ++i) {
      ASSERT_NEAR(ours[r * vocab + i], row[i], 1e-4f * scale) << what << " position " << first_row + r << " token " << i;
    }
  }
}

// Runs `tokens` through `model` in one pass asking for its final hidden states (Batch::return_hidden) and checks
// those at positions 0 .. n-2 (a draft head's inputs) against `expected`, as expect_rows_close does.
inline void expect_hidden_states(Model& model, Backend& backend, const std::vector<int32_t>& tokens,
                                 const std::vector<std::vector<float>>& expected, int64_t page, int64_t blocks,
                                 const std::string& what) {
  const int n = static_cast<int>(tokens.size());
  const size_t d = expected[0].size();
  KvStorage kv(backend, model.config(), model.local_kv_heads(), blocks, page, DType::kF32);
  Batch b = one_sequence(tokens, 0, n, page, blocks);
  b.return_hidden = true;
  std::vector<float> logits;
  model.forward(b, kv, logits);
  const auto rows = model.hidden_rows();
  ASSERT_EQ(rows.size(), static_cast<size_t>(n) * d) << what;
  expect_rows_close(std::vector<float>(rows.begin(), rows.end() - static_cast<long>(d)), expected, 0, what);
}

}  // namespace servetune::testing
