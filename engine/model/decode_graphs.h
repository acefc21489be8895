// Decode steps as backend graphs (compile = graphs), for every model family that can run a step without host work:
// which batches qualify, their padding to a batch-size bucket and a block-table width class, the padded batch's index
// arrays at fixed places in one backend buffer, and the warm-up / capture / replay of each (bucket, width) key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "model/batch.h"
#include "model/batch_indices.h"
#include "model/kv_storage.h"

namespace servetune {

class DecodeGraphs {
 public:
  // max_bs 0: graphs off.
  DecodeGraphs(Backend& backend, int64_t max_bs) : backend_(backend), max_bs_(max_bs) {}

  int64_t max_bs() const { return max_bs_; }
  // Whether `batch` is a decode step graphs take: at most max_bs tokens, token t its sequence t's only token and logits
  // row t. (Draft trees, hidden-state batches and tensor parallelism are the caller's to refuse.)
  bool takes(const Batch& batch) const;

  // A padded step: `bucket` tokens (the real ones first; padding tokens are sequences of their own whose one block is
  // the cache's scratch block), block tables `width` wide, its indices in backend memory, and `real_tokens` (backend
  // memory: one int32, the batch's own token count) for ops that must tell padding apart.
  struct Step {
    int64_t key = 0;
    int64_t bucket = 0;
    int64_t width = 0;
    BatchIndices ix;
    const int32_t* real_tokens = nullptr;
  };
  // Pads `batch` (takes() must hold) and uploads its indices; graphs captured on another cache are dropped first.
  Step prepare(const Batch& batch, const KvStorage& kv);
  // Runs `compute` (the step's ops, no host work) for `step`: replays its captured graph; a key's first step runs
  // eagerly (lazily grown scratch settles), its second is captured and replayed; a backend without graphs runs it
  // eagerly every time.
  void run(const Step& step, const std::function<void()>& compute);
  // Forgets every captured graph (the buffers they use are about to move).
  void drop();

 private:
  Backend& backend_;
  int64_t max_bs_;
  std::unique_ptr<Buffer> indices_;
  std::vector<int32_t> packed_;
  const KvStorage* kv_ = nullptr;
  std::set<int64_t> warm_, captured_;
};

}  // namespace servetune
