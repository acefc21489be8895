// N-gram speculation and lossless draft verification (see speculator.h).
#include "runtime/speculator.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "formats/token_map.h"
#include "model/checkpoint.h"
#include "model/eagle_head.h"
#include "runtime/draft_speculator.h"
#include "runtime/draft_head_speculator.h"
#include "servetune/engine_config.h"

namespace servetune {
namespace {

constexpr int64_t kDefaultDraftTokens = 4;
constexpr int64_t kDefaultEagleSteps = 3;  // SGLang's choice for DeepSeek-V3 MTP (steps 3, topk 1, draft tokens 4)
// SGLang's default tree for llama-family targets: 5 steps, topk 4, 8 draft tokens (the root included).
constexpr int64_t kDefaultTreeSteps = 5;
constexpr int64_t kDefaultTreeDraftTokens = 8;

}  // namespace

NgramSpeculator::NgramSpeculator(int64_t min_n, int64_t max_n) : min_n_(min_n), max_n_(max_n) {
  if (min_n < 1 || max_n < min_n) throw_usage("ngram speculation needs 1 <= min match window <= max match window");
}

void NgramSpeculator::propose(std::span<const DraftSlot> slots) {
  for (const DraftSlot& slot : slots) {
    propose(slot.tokens, slot.max_tokens, *slot.draft);
    if (slot.draft_probs != nullptr) slot.draft_probs->clear();
  }
}

void NgramSpeculator::propose(std::span<const int32_t> context, int64_t max_tokens, std::vector<int32_t>& out) const {
  out.clear();
  const auto size = static_cast<int64_t>(context.size());
  if (max_tokens <= 0) return;
  for (int64_t n = std::min(max_n_, size - 1); n >= min_n_; --n) {
    const auto suffix = context.subspan(static_cast<size_t>(size - n));
    // Most recent earlier occurrence: start positions i < size - n, scanned from the end.
    for (int64_t i = size - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + i)) continue;
      const int64_t from = i + n;
      const int64_t count = std::min(max_tokens, size - from);
      out.assign(context.begin() + from, context.begin() + from + count);
      return;
    }
  }
}

std::unique_ptr<Speculator> make_speculator(const EngineConfig& config, const SpeculatorContext& context) {
  const SpeculativeAlgorithm algo = config.speculative_algorithm;
  if (algo == SpeculativeAlgorithm::kNone) return nullptr;
  if (algo == SpeculativeAlgorithm::kNgram) {
    return std::make_unique<NgramSpeculator>(config.speculative_ngram_min_match_window_size,
                                             config.speculative_ngram_max_match_window_size);
  }
  if (algo == SpeculativeAlgorithm::kDraft) {
    if (config.speculative_draft_model.empty()) {
      throw_usage("speculative_algorithm draft needs a draft model (--speculative-draft-model PATH)");
    }
    return std::make_unique<DraftModelSpeculator>(config.speculative_draft_model, config.model, context);
  }
  // eagle / mtp: a draft head reading the target's hidden states.
  if (context.target == nullptr) throw Error(ErrorKind::kInternal, "a draft head needs the target's checkpoint");
  if (!context.target_hidden) {
    throw_unsupported("speculative_algorithm " + to_string(algo) + " needs the target's hidden states, which this "
                      "model does not return; use another algorithm");
  }
  DraftTreeShape shape;
  shape.num_steps = speculative_draft_steps(config);
  shape.topk = std::max<int64_t>(1, config.speculative_eagle_topk);
  shape.num_nodes = speculative_draft_tokens(config);
  std::vector<int32_t> draft_vocab;
  if (!config.speculative_token_map.empty()) {
    draft_vocab = read_token_map(config.speculative_token_map, context.target->config().vocab);
  }
  const bool q8_0 = config.speculative_draft_model_quantization == DraftModelQuantization::kQ8_0;
  if (algo == SpeculativeAlgorithm::kEagle && !config.speculative_draft_model.empty()) {
    auto head = std::make_shared<EagleHead>(config.speculative_draft_model, *context.target, *context.backend, draft_vocab, q8_0);
    return std::make_unique<DraftHeadSpeculator>(std::shared_ptr<Model>(head, &head->model()), context, shape, "eagle");
  }
  if (context.target->config().nextn_layers == 0) {
    throw_unsupported("speculative_algorithm " + to_string(algo) + " without a draft model runs the model's own "
                      "multi-token-prediction layer (DeepSeek-V3's num_nextn_predict_layers); " + config.model +
                      " has none: give an EAGLE head (--speculative-draft-model DIR with --speculative-algorithm EAGLE)");
  }
  return std::make_unique<DraftHeadSpeculator>(std::shared_ptr<Model>(context.target->load_next_n(*context.backend, 0, draft_vocab, q8_0)),
                                               context, shape, "mtp");
}

int64_t speculative_draft_steps(const EngineConfig& config) {
  if (config.speculative_algorithm == SpeculativeAlgorithm::kNone) return 0;
  if (config.speculative_algorithm == SpeculativeAlgorithm::kNgram) return speculative_draft_tokens(config);
  if (config.speculative_num_steps > 0) return config.speculative_num_steps;
  if (config.speculative_eagle_topk > 1) return kDefaultTreeSteps;
  if (config.speculative_num_draft_tokens > 0) return config.speculative_num_draft_tokens - 1;
  return config.speculative_algorithm == SpeculativeAlgorithm::kDraft ? kDefaultDraftTokens : kDefaultEagleSteps;
}

int64_t speculative_draft_tokens(const EngineConfig& config) {
  if (config.speculative_algorithm == SpeculativeAlgorithm::kNone) return 0;
  if (config.speculative_algorithm == SpeculativeAlgorithm::kNgram) {
    return config.speculative_num_draft_tokens > 0 ? config.speculative_num_draft_tokens : kDefaultDraftTokens;
  }
  if (config.speculative_eagle_topk <= 1) return speculative_draft_steps(config);
  // A tree: num_draft_tokens counts its nodes with the root (the last accepted token), as in SGLang; by default 8,
  // or every candidate of a smaller tree.
  if (config.speculative_num_draft_tokens > 0) return config.speculative_num_draft_tokens - 1;
  const int64_t topk = config.speculative_eagle_topk, steps = speculative_draft_steps(config);
  return std::min<int64_t>(kDefaultTreeDraftTokens - 1, topk + (steps - 1) * topk * topk);
}

int64_t verify_draft(Sampler& sampler, std::span<const int32_t> draft, const std::function<std::span<float>(size_t)>& row,
                     const std::function<std::vector<int32_t>()>& banned, const std::function<bool(SampleResult&)>& emit,
                     std::span<const float> draft_probs) {
  int64_t accepted = 0;
  for (size_t j = 0; j <= draft.size(); ++j) {
    const int32_t candidate = j < draft.size() ? draft[j] : -1;
    const std::vector<int32_t> ban = banned();
    const std::span<float> logits = row(j);
    std::span<const float> q;
    if (candidate >= 0 && !draft_probs.empty()) {
      if (draft_probs.size() < (j + 1) * logits.size()) throw Error(ErrorKind::kInternal, "verify_draft: fewer draft distributions than drafts");
      q = draft_probs.subspan(j * logits.size(), logits.size());
    }
    SampleResult r = sampler.sample(logits, ban, candidate, q);
    const bool match = candidate >= 0 && r.token == candidate;
    sampler.accept(r.token);
    const bool finished = emit(r);
    if (match) ++accepted;
    if (finished || !match) break;
  }
  return accepted;
}

std::vector<int32_t> verify_tree(Sampler& sampler, std::span<const int32_t> draft, std::span<const int32_t> parents,
                                 const std::function<std::span<float>(size_t)>& row,
                                 const std::function<std::vector<int32_t>()>& banned,
                                 const std::function<bool(SampleResult&)>& emit) {
  if (parents.size() != draft.size()) throw Error(ErrorKind::kInternal, "verify_tree: one parent per draft node");
  std::vector<int32_t> path;
  std::vector<int32_t> children, tokens;
  int32_t node = -1;  // the root: the request's last token, logits row 0
  for (;;) {
    children.clear();
    tokens.clear();
    for (size_t i = 0; i < draft.size(); ++i) {
      if (parents[i] == node) {
        children.push_back(static_cast<int32_t>(i));
        tokens.push_back(draft[i]);
      }
    }
    const std::vector<int32_t> ban = banned();
    SampleResult r = sampler.sample_siblings(row(static_cast<size_t>(node + 1)), ban, tokens);
    sampler.accept(r.token);
    const bool finished = emit(r);
    const auto match = std::find(tokens.begin(), tokens.end(), r.token);
    if (match == tokens.end()) return path;
    node = children[static_cast<size_t>(match - tokens.begin())];
    path.push_back(node);
    if (finished) return path;
  }
}

}  // namespace servetune
