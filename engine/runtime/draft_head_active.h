// One request's drafting state inside a DraftHeadSpeculator::propose call (chains and trees), shared by
// draft_head_speculator.cpp and draft_tree.cpp. Tree candidates are appended level by level, so a parent's index is
// always below its children's.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/draft_head_speculator.h"

namespace servetune {

struct DraftHeadSpeculator::Active {
  const DraftSlot* slot = nullptr;
  State* state = nullptr;
  int64_t want = 0;          // draft tokens to propose (a tree's nodes)
  int64_t real = 0;          // MTP positions from the target's states: the request's tokens - 1
  int64_t steps = 1;         // head forwards this step (num_steps, or fewer near the context length)
  std::vector<float> last;   // the head's hidden state at its last position (a draft step's input)
  bool caught_up = false;    // the cache holds every position the target's states give
  bool stopped = false;      // the MTP cache ran out of blocks: keep what was proposed

  // A tree: every candidate node so far; the ones to feed next; how many were fed into the head's cache.
  struct Candidate {
    int32_t token = 0;
    int32_t parent = -1;     // index in cands, -1: the root (the request's last token)
    double score = 0.0;      // cumulative draft probability along its path
    int32_t depth = 1;       // the root's children: 1
    uint64_t mask = 0;       // once fed: its own and its fed ancestors' bits over the head's tree cache indices
    std::vector<float> out;  // once fed: the head's output hidden state there (its children's input)
  };
  std::vector<Candidate> cands;
  std::vector<int32_t> beam;
  int64_t fed = 0;
};

}  // namespace servetune
