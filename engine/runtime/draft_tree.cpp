// Draft trees of a draft head (topk > 1, SGLang's EAGLE-2 drafting; see draft_head_speculator.h): the root's
// children, the expansion steps over the head's own tree-masked cache, and the choice of the num_nodes best nodes.
// Invariant: the fed nodes' cache rows lie past the request's real positions and propose() truncates them.
#include <algorithm>
#include <numeric>
#include <utility>

#include "backend/cpu/vector_math.h"
#include "core/error.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "runtime/draft_head_active.h"

namespace servetune {
namespace {

// The k most probable tokens of softmax(logits), ties to the lower id, with their probabilities: one pass keeping the
// best k (k is small), and the softmax's normaliser from the vectorised exp.
void draft_top_k(std::span<const float> logits, int64_t k, std::vector<float>& scratch,
                 std::vector<std::pair<int32_t, double>>& out) {
  const float max = cpu::max_value(logits);
  scratch.resize(logits.size());
  const double sum = cpu::exp_scaled(logits, max, 1.0f, scratch);
  const auto count = static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(logits.size())));
  std::vector<int32_t> best;  // ids, best first
  for (size_t t = 0; t < logits.size(); ++t) {
    const float l = logits[t];
    if (best.size() == count && !(l > logits[static_cast<size_t>(best.back())])) continue;
    size_t at = best.size();
    while (at > 0 && l > logits[static_cast<size_t>(best[at - 1])]) --at;
    best.insert(best.begin() + static_cast<long>(at), static_cast<int32_t>(t));
    if (best.size() > count) best.pop_back();
  }
  out.clear();
  for (const int32_t t : best) out.emplace_back(t, static_cast<double>(scratch[static_cast<size_t>(t)]) / sum);
}

// Candidate indices by score, best first; ties keep the lower index (so a parent ranks before its children).
template <class Candidate>
std::vector<int32_t> by_score(const std::vector<Candidate>& cands, std::vector<int32_t> ids) {
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return cands[static_cast<size_t>(a)].score > cands[static_cast<size_t>(b)].score;
  });
  return ids;
}

}  // namespace

// The first draft forward's distribution: its top-k tokens are the root's children, all of them fed next.
void DraftHeadSpeculator::tree_root(Active& a, std::span<const float> logits, std::span<const float> hidden) {
  a.last.assign(hidden.begin(), hidden.end());
  std::vector<float> scratch;
  std::vector<std::pair<int32_t, double>> top;
  draft_top_k(logits, topk_, scratch, top);
  for (const auto& [token, p] : top) {
    a.beam.push_back(static_cast<int32_t>(a.cands.size()));
    a.cands.push_back({token, -1, p, 1, 0, {}});
  }
}

// Each step feeds every request's beam (at depth-based positions, each attending to the head's committed rows and its
// fed ancestors), adds each fed node's top-k children as candidates, and makes the top-k of those the next beam.
void DraftHeadSpeculator::tree_steps(std::vector<Active>& active) {
  const auto vocab = static_cast<size_t>(model_->config().vocab);
  const auto width = static_cast<size_t>(hidden_);
  std::vector<float> scratch;
  std::vector<std::pair<int32_t, double>> top;
  for (int64_t step = 1;; ++step) {
    std::vector<Active*> stepping;
    int64_t max_blocks = 1;
    for (Active& a : active) {
      if (a.stopped || a.beam.empty() || step >= a.steps) continue;
      Sequence& seq = a.state->seq;
      if (!blocks_->allocate(seq, a.real + a.fed + static_cast<int64_t>(a.beam.size()))) {
        a.stopped = true;  // the head's cache is full: the candidates so far make the tree
        continue;
      }
      stepping.push_back(&a);
      max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(seq.block_table.size()));
    }
    if (stepping.empty()) return;
    Batch& b = batch_;
    for (auto* v : {&b.tokens, &b.positions, &b.seq_of_token, &b.slot_mapping, &b.logits_indices, &b.tree_base}) v->clear();
    b.tree_mask.clear();
    b.input_hidden.clear();
    b.max_blocks_per_seq = max_blocks;
    b.block_tables.assign(stepping.size() * static_cast<size_t>(max_blocks), -1);
    for (size_t i = 0; i < stepping.size(); ++i) {
      Active& a = *stepping[i];
      const std::vector<int32_t>& table = a.state->seq.block_table;
      std::copy(table.begin(), table.end(), b.block_tables.begin() + static_cast<long>(i) * max_blocks);
      for (const int32_t c : a.beam) {
        Active::Candidate& cand = a.cands[static_cast<size_t>(c)];
        const int64_t index = a.real + a.fed;  // its cache index; its position is the depth past the last real one
        cand.mask = (cand.parent < 0 ? 0 : a.cands[static_cast<size_t>(cand.parent)].mask) | (uint64_t{1} << a.fed);
        ++a.fed;
        b.logits_indices.push_back(static_cast<int32_t>(b.tokens.size()));
        b.tokens.push_back(cand.token);
        b.positions.push_back(static_cast<int32_t>(a.real - 1 + cand.depth));
        b.seq_of_token.push_back(static_cast<int32_t>(i));
        b.slot_mapping.push_back(static_cast<int32_t>(table[static_cast<size_t>(index / page_size_)] * page_size_ + index % page_size_));
        b.tree_base.push_back(static_cast<int32_t>(a.real));
        b.tree_mask.push_back(cand.mask);
        const std::vector<float>& in = cand.parent < 0 ? a.last : a.cands[static_cast<size_t>(cand.parent)].out;
        b.input_hidden.insert(b.input_hidden.end(), in.begin(), in.end());
      }
    }
    forward(true);
    const std::span<const float> hidden = model_->hidden_rows();
    size_t row = 0;
    for (Active* ap : stepping) {
      Active& a = *ap;
      std::vector<int32_t> fresh;
      for (const int32_t c : a.beam) {
        const auto h = hidden.subspan(row * width, width);
        a.cands[static_cast<size_t>(c)].out.assign(h.begin(), h.end());
        draft_top_k(std::span<const float>(logits_.data() + row * vocab, vocab), topk_, scratch, top);
        ++row;
        const double score = a.cands[static_cast<size_t>(c)].score;
        const int32_t depth = a.cands[static_cast<size_t>(c)].depth + 1;
        for (const auto& [token, p] : top) {
          fresh.push_back(static_cast<int32_t>(a.cands.size()));
          a.cands.push_back({token, c, score * p, depth, 0, {}});
        }
      }
      a.beam = by_score(a.cands, std::move(fresh));
      a.beam.resize(std::min<size_t>(a.beam.size(), static_cast<size_t>(topk_)));
      std::sort(a.beam.begin(), a.beam.end());
    }
  }
}

// The request's drafts: its `want` best candidates by score, in candidate order (parents first), with their parents.
void DraftHeadSpeculator::tree_select(Active& a) const {
  if (a.slot->draft_parents == nullptr) throw Error(ErrorKind::kInternal, "a draft tree needs DraftSlot::draft_parents");
  std::vector<int32_t> ids(a.cands.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<int32_t> chosen = by_score(a.cands, std::move(ids));
  chosen.resize(std::min<size_t>(chosen.size(), static_cast<size_t>(std::max<int64_t>(0, a.want))));
  std::sort(chosen.begin(), chosen.end());
  std::vector<int32_t> at(a.cands.size(), -1);  // a candidate's index among the drafts
  for (size_t i = 0; i < chosen.size(); ++i) {
    const Active::Candidate& cand = a.cands[static_cast<size_t>(chosen[i])];
    const int32_t parent = cand.parent < 0 ? -1 : at[static_cast<size_t>(cand.parent)];
    if (cand.parent >= 0 && parent < 0) throw Error(ErrorKind::kInternal, "a draft tree node chosen without its parent");
    at[static_cast<size_t>(chosen[i])] = static_cast<int32_t>(i);
    a.slot->draft->push_back(cand.token);
    a.slot->draft_parents->push_back(parent);
  }
}

}  // namespace servetune
