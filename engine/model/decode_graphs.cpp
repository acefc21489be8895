// Decode steps as backend graphs (see decode_graphs.h).
#include "model/decode_graphs.h"

#include <algorithm>

namespace servetune {

bool DecodeGraphs::takes(const Batch& batch) const {
  const int64_t n = batch.n_tokens();
  if (max_bs_ <= 0 || n > max_bs_ || batch.n_seqs() != n || static_cast<int64_t>(batch.logits_indices.size()) != n) {
    return false;
  }
  for (int64_t t = 0; t < n; ++t) {
    if (batch.seq_of_token[static_cast<size_t>(t)] != t || batch.logits_indices[static_cast<size_t>(t)] != t) return false;
  }
  return true;
}

DecodeGraphs::Step DecodeGraphs::prepare(const Batch& batch, const KvStorage& kv) {
  const int64_t n = batch.n_tokens();
  Step step;
  // Buckets: 1, 2, 4, 8, then multiples of 8, capped at max_bs_; block-table widths: powers of two from 16.
  step.bucket = n <= 8 ? 1 : (n + 7) / 8 * 8;
  while (step.bucket < n) step.bucket *= 2;
  step.bucket = std::min(step.bucket, max_bs_);
  step.width = 16;
  while (step.width < batch.max_blocks_per_seq) step.width *= 2;
  step.key = (step.width << 20) + step.bucket;
  if (&kv != kv_) {
    drop();
    kv_ = &kv;
  }
  // The padded batch in a fixed layout of max_bs_ rows: tokens, slots, positions, sequences, logits rows, the real
  // token count, then the block tables.
  const int64_t rows = max_bs_, width = step.width;
  packed_.assign(static_cast<size_t>(5 * rows + 1 + rows * width), -1);
  int32_t* tokens = packed_.data();
  int32_t* slots = tokens + rows;
  int32_t* positions = slots + rows;
  int32_t* seqs = positions + rows;
  int32_t* logits_rows = seqs + rows;
  int32_t* real = logits_rows + rows;
  int32_t* tables = real + 1;
  const int64_t page = kv.page_size();
  for (int64_t t = 0; t < step.bucket; ++t) {
    const bool own = t < n;
    tokens[t] = own ? batch.tokens[static_cast<size_t>(t)] : 0;
    slots[t] = static_cast<int32_t>(own ? batch.slot_mapping[static_cast<size_t>(t)] : kv.scratch_block() * page);
    positions[t] = own ? batch.positions[static_cast<size_t>(t)] : 0;
    seqs[t] = static_cast<int32_t>(t);
    logits_rows[t] = static_cast<int32_t>(t);
    if (own) {
      std::copy_n(batch.block_tables.begin() + t * batch.max_blocks_per_seq, batch.max_blocks_per_seq, tables + t * width);
    } else {
      tables[t * width] = static_cast<int32_t>(kv.scratch_block());
    }
  }
  *real = static_cast<int32_t>(n);
  const size_t bytes = packed_.size() * sizeof(int32_t);
  if (!indices_ || indices_->size() < bytes) {
    drop();
    indices_ = backend_.allocate(bytes);
  }
  backend_.upload(*indices_, 0, packed_.data(), bytes);
  const auto* base = static_cast<const int32_t*>(indices_->data());
  step.ix.tokens = base;
  step.ix.slots = base + rows;
  step.ix.positions = base + 2 * rows;
  step.ix.seq_of_token = base + 3 * rows;
  step.ix.logits_rows = base + 4 * rows;
  step.real_tokens = base + 5 * rows;
  step.ix.block_tables = base + 5 * rows + 1;
  return step;
}

void DecodeGraphs::run(const Step& step, const std::function<void()>& compute) {
  if (captured_.count(step.key) != 0) {
    backend_.replay_graph(step.key);
  } else if (warm_.insert(step.key).second) {  // a key's first step runs eagerly: lazily grown scratch settles
    compute();
  } else if (backend_.begin_capture()) {
    try {
      compute();
    } catch (...) {
      backend_.end_capture(-1);
      throw;
    }
    backend_.end_capture(step.key);
    captured_.insert(step.key);
    backend_.replay_graph(step.key);
  } else {
    compute();  // a backend without graphs runs the padded step eagerly
  }
}

void DecodeGraphs::drop() {
  if (!captured_.empty()) backend_.drop_graphs();
  captured_.clear();
}

}  // namespace servetune
