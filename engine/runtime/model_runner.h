// Turns a scheduler step into the model's Batch (flattened tokens, positions, slots, block tables), runs the
// forward pass, and returns one logits row per sequence that samples this step (1 + num_draft rows for a sequence
// verifying speculative drafts).
#pragma once

#include <span>
#include <vector>

#include "model/batch.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "runtime/scheduler.h"

namespace servetune {

class TensorParallelGroup;

class ModelRunner {
 public:
  ModelRunner(Model& model, KvStorage& kv) : model_(&model), kv_(&kv) {}
  // Runs every step on all ranks of `group`.
  explicit ModelRunner(TensorParallelGroup& group);

  // Runs `step`; afterwards logits(i) is the i-th logits row: sequences in step order, each with its
  // prompt_logit_rows, then (a sampling one) 1 + num_draft consecutive rows.
  void run(const SchedulerOutput& step);
  std::span<float> logits(size_t i);
  // Runs `step` drawing each logits row's token on the device as rows[i] says (TensorParallelGroup::device_sampling):
  // afterwards token(i) is row i's token, and logits() has nothing.
  void run_sampled(const SchedulerOutput& step, std::span<const SampleRow> rows);
  int32_t token(size_t i) const { return tokens_.at(i); }
  // Every step's batch asks the model for its tokens' final hidden states (a draft head's input); afterwards
  // hidden_rows() holds them, [step tokens, hidden] in batch order.
  void set_return_hidden(bool on) { return_hidden_ = on; }
  std::span<const float> hidden_rows();
  // Moves KV rows of the sequence with `block_table` from cache indices src[i] to dst[i], in order, on every rank
  // (an accepted draft-tree path into consecutive positions; a group's ranks in this process only).
  void move_kv(const std::vector<int32_t>& block_table, const std::vector<int64_t>& src, const std::vector<int64_t>& dst);
  const Batch& last_batch() const { return batch_; }

  // Builds the batch without running it (for tests).
  static void build_batch(const SchedulerOutput& step, int64_t page_size, Batch& batch);
  // Turns batch rows [root, root + seq.draft_parents.size()] (a sequence's last token and its draft-tree nodes)
  // into a tree: depth-based positions, Batch::tree_base and tree_mask (every other row an ordinary one).
  static void mark_tree(const Sequence& seq, int64_t root, Batch& batch);
  // The logits rows `s` asks for before its sampling rows (Sequence::prompt_logits), from its state before the step
  // completes: the prompt positions this step computes that predict a prompt token and were not returned before.
  static int64_t prompt_logit_rows(const ScheduledSeq& s);

 private:
  int64_t page_size() const;

  Model* model_ = nullptr;  // without a group
  KvStorage* kv_ = nullptr;
  TensorParallelGroup* group_ = nullptr;
  bool return_hidden_ = false;
  Batch batch_;
  std::vector<float> logits_;
  std::vector<int32_t> tokens_;
};

}  // namespace servetune
