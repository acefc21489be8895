// Batch building and the forward call (see model_runner.h).
#include "runtime/model_runner.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/tensor_parallel_group.h"

namespace servetune {

// A verifying sequence's draft tree, whose root (its last token) is batch row `root` followed by the nodes: each
// node's position is the root's plus its depth, and it attends to the context and its ancestors (Batch::tree_mask).
// The cache indices (slots) stay consecutive.
void ModelRunner::mark_tree(const Sequence& seq, int64_t root, Batch& batch) {
  const size_t nodes = seq.draft_parents.size();
  if (nodes + 1 > 64) throw Error(ErrorKind::kInternal, "a draft tree of more than 63 nodes");
  batch.tree_base.resize(batch.tokens.size(), 0);
  batch.tree_mask.resize(batch.tokens.size(), 0);
  const int32_t base = batch.positions[static_cast<size_t>(root)];
  std::vector<int32_t> depth(nodes + 1, 0);
  std::vector<uint64_t> mask(nodes + 1, 1);
  for (size_t j = 0; j < nodes; ++j) {
    const auto parent = static_cast<size_t>(seq.draft_parents[j] + 1);
    if (parent > j) throw Error(ErrorKind::kInternal, "a draft tree node before its parent");
    depth[j + 1] = depth[parent] + 1;
    mask[j + 1] = mask[parent] | (uint64_t{1} << (j + 1));
  }
  for (size_t i = 0; i <= nodes; ++i) {
    const auto t = static_cast<size_t>(root) + i;
    batch.positions[t] = base + depth[i];
    batch.tree_base[t] = base;
    batch.tree_mask[t] = mask[i];
  }
}

void ModelRunner::build_batch(const SchedulerOutput& step, int64_t page_size, Batch& batch) {
  batch.tokens.clear();
  batch.positions.clear();
  batch.seq_of_token.clear();
  batch.slot_mapping.clear();
  batch.logits_indices.clear();
  batch.tree_base.clear();
  batch.tree_mask.clear();
  int64_t max_blocks = 1;
  for (const auto& s : step.seqs) max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(s.seq->block_table.size()));
  batch.max_blocks_per_seq = max_blocks;
  batch.block_tables.assign(step.seqs.size() * static_cast<size_t>(max_blocks), -1);

  for (size_t i = 0; i < step.seqs.size(); ++i) {
    const Sequence& seq = *step.seqs[i].seq;
    std::copy(seq.block_table.begin(), seq.block_table.end(), batch.block_tables.begin() + static_cast<long>(i) * max_blocks);
    for (int64_t p = seq.num_computed; p < seq.num_computed + step.seqs[i].num_tokens; ++p) {
      batch.tokens.push_back(seq.tokens[static_cast<size_t>(p)]);
      batch.positions.push_back(static_cast<int32_t>(p));
      batch.seq_of_token.push_back(static_cast<int32_t>(i));
      const int32_t block = seq.block_table[static_cast<size_t>(p / page_size)];
      batch.slot_mapping.push_back(static_cast<int32_t>(block * page_size + p % page_size));
    }
    if (step.seqs[i].samples && step.seqs[i].num_draft > 0 && !seq.draft_parents.empty()) {
      mark_tree(seq, static_cast<int64_t>(batch.tokens.size()) - 1 - step.seqs[i].num_draft, batch);
    }
    // Teacher-forced prompt positions not returned before first, then the sampling rows.
    const int64_t prompt_rows = prompt_logit_rows(step.seqs[i]);
    const int64_t first_prompt_row = std::max(seq.num_computed, seq.prompt_logits_done) - seq.num_computed;
    const auto seq_start = static_cast<int32_t>(batch.tokens.size() - static_cast<size_t>(step.seqs[i].num_tokens));
    for (int64_t r = 0; r < prompt_rows; ++r) batch.logits_indices.push_back(seq_start + static_cast<int32_t>(first_prompt_row + r));
    if (!step.seqs[i].samples) continue;
    // A verifying sequence needs logits at every draft position too: rows for its last 1 + num_draft tokens.
    const auto end = static_cast<int32_t>(batch.tokens.size());
    for (auto r = end - 1 - static_cast<int32_t>(step.seqs[i].num_draft); r < end; ++r) batch.logits_indices.push_back(r);
  }
  if (batch.has_tree()) {  // rows of sequences after the last tree: ordinary ones
    batch.tree_base.resize(batch.tokens.size(), 0);
    batch.tree_mask.resize(batch.tokens.size(), 0);
  }
}

int64_t ModelRunner::prompt_logit_rows(const ScheduledSeq& s) {
  const Sequence& seq = *s.seq;
  if (!seq.prompt_logits) return 0;
  const int64_t begin = std::max(seq.num_computed, seq.prompt_logits_done);
  const int64_t end = std::min(seq.num_computed + s.num_tokens, seq.prompt_len - 1);
  return std::max<int64_t>(0, end - begin);
}

ModelRunner::ModelRunner(TensorParallelGroup& group) : group_(&group) {}

int64_t ModelRunner::page_size() const { return group_ ? group_->page_size() : kv_->page_size(); }

void ModelRunner::run(const SchedulerOutput& step) {
  build_batch(step, page_size(), batch_);
  batch_.return_hidden = return_hidden_;
  if (group_) {
    group_->forward(batch_, logits_);
  } else {
    model_->forward(batch_, *kv_, logits_);
  }
}

void ModelRunner::run_sampled(const SchedulerOutput& step, std::span<const SampleRow> rows) {
  if (!group_) throw Error(ErrorKind::kInternal, "device sampling runs through a TensorParallelGroup");
  build_batch(step, page_size(), batch_);
  batch_.return_hidden = return_hidden_;
  logits_.clear();
  group_->forward_sampled(batch_, rows, tokens_);
}

std::span<const float> ModelRunner::hidden_rows() { return group_ ? group_->hidden_rows() : model_->hidden_rows(); }

void ModelRunner::move_kv(const std::vector<int32_t>& block_table, const std::vector<int64_t>& src,
                          const std::vector<int64_t>& dst) {
  if (!group_) throw Error(ErrorKind::kInternal, "ModelRunner::move_kv runs through a TensorParallelGroup");
  const int64_t page = page_size();
  const auto slot = [&](int64_t index) {
    return static_cast<int32_t>(block_table.at(static_cast<size_t>(index / page)) * page + index % page);
  };
  KvMove move;
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == dst[i]) continue;
    move.from.push_back(slot(src[i]));
    move.to.push_back(slot(dst[i]));
  }
  group_->move_kv(move);
}

std::span<float> ModelRunner::logits(size_t i) {
  const size_t vocab = static_cast<size_t>(group_ ? group_->config().vocab : model_->config().vocab);
  return std::span<float>(logits_).subspan(i * vocab, vocab);
}

}  // namespace servetune
