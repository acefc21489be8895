// Random-length synthetic workload (vLLM's RandomDataset): per request an input and output length drawn uniformly
// from the range-ratio interval, a shared random prefix, then consecutive allowed token ids from a random offset,
// made token-stable so the server sees the requested length.
#include <cmath>

#include "datasets/dataset.h"
#include "datasets/token_prompt.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::datasets {
namespace {

struct Range {
  int64_t lo, hi;
};

// vLLM: [floor(L(1-r)), ceil(L(1+r))], output low clamped to 1. SGLang: [max(int(L r), 1), L] for inputs and
// [int(L r), L] for outputs (SGLang's sample_random_requests; an output low of 0 is raised to 1), r in [0, 1].
Range length_range(int64_t len, double r, const std::string& mode, bool is_output) {
  if (mode == "vllm") {
    Range x{static_cast<int64_t>(std::floor(static_cast<double>(len) * (1.0 - r))),
            static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1.0 + r)))};
    if (is_output) {
      x.lo = std::max<int64_t>(x.lo, 1);
      x.hi = std::max<int64_t>(x.hi, 1);
    }
    return x;
  }
  return {std::max<int64_t>(static_cast<int64_t>(static_cast<double>(len) * r), 1), len};
}

}  // namespace

Workload sample_random(const DatasetOptions& o, const Tokenizer& tokenizer) {
  if (o.multi_turn) return sample_random_sessions(o, tokenizer);
  if (!o.path.empty()) throw_usage("--dataset-name random takes no --dataset-path (" + o.path + ")");
  if (o.random_range_mode != "vllm" && o.random_range_mode != "sglang") {
    throw_usage("--random-range-mode must be vllm or sglang, got '" + o.random_range_mode + "'");
  }
  if (o.random_range_mode == "vllm" && !(o.random_range_ratio >= 0.0 && o.random_range_ratio < 1.0)) {
    throw_usage("--random-range-ratio must be in [0, 1) with --random-range-mode vllm");
  }
  if (o.random_range_mode == "sglang" && !(o.random_range_ratio >= 0.0 && o.random_range_ratio <= 1.0)) {
    throw_usage("--random-range-ratio must be in [0, 1] with --random-range-mode sglang");
  }
  if (o.random_input_len < 1) throw_usage("--random-input-len must be >= 1");
  if (o.random_output_len < 1) throw_usage("--random-output-len must be >= 1");
  if (o.random_prefix_len < 0) throw_usage("--random-prefix-len must be >= 0");

  const int64_t n_special = num_special_tokens(tokenizer);
  const int64_t real_input_len = std::max<int64_t>(0, o.random_input_len - n_special);
  const Range in = length_range(real_input_len, o.random_range_ratio, o.random_range_mode, false);
  const Range out = length_range(o.random_output_len, o.random_range_ratio, o.random_range_mode, true);
  if (o.random_prefix_len + in.lo < 1) {
    throw_usage("--random-input-len " + std::to_string(o.random_input_len) + " leaves no prompt tokens after the " +
                std::to_string(n_special) + " special token(s) the tokenizer adds");
  }
  const std::vector<int32_t> allowed = allowed_token_ids(tokenizer);
  if (allowed.empty()) throw_usage(tokenizer.source() + ": the vocabulary has no non-special tokens");

  Rng rng(o.seed);
  std::vector<int32_t> prefix;
  for (int64_t i = 0; i < o.random_prefix_len; ++i) prefix.push_back(allowed[rng.below(allowed.size())]);
  std::vector<int64_t> input_lens, output_lens, offsets;
  for (int64_t i = 0; i < o.num_prompts; ++i) input_lens.push_back(rng.uniform_int(in.lo, in.hi));
  for (int64_t i = 0; i < o.num_prompts; ++i) output_lens.push_back(rng.uniform_int(out.lo, out.hi));
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    offsets.push_back(static_cast<int64_t>(rng.below(static_cast<uint64_t>(tokenizer.vocab_size()))));
  }

  Workload w;
  w.dataset_name = "random";
  std::vector<int64_t> achieved;
  int64_t mismatched = 0, mismatch_tokens = 0;
  const int64_t n_allowed = static_cast<int64_t>(allowed.size());
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    std::vector<int32_t> ids = prefix;
    for (int64_t j = 0; j < input_lens[i]; ++j) ids.push_back(allowed[(offsets[i] + i + j) % n_allowed]);
    const size_t target = ids.size();
    StablePrompt p = make_stable_prompt(tokenizer, std::move(ids), target, allowed, rng);
    if (p.ids.size() != target) {
      ++mismatched;
      mismatch_tokens += static_cast<int64_t>(p.ids.size()) - static_cast<int64_t>(target);
    }
    SampleRequest r;
    r.prompt_len = static_cast<int64_t>(p.ids.size()) + n_special;
    r.prompt = std::move(p.text);
    r.output_len = output_lens[i];
    r.id = std::to_string(i);
    achieved.push_back(r.prompt_len);
    w.requests.push_back(std::move(r));
  }
  w.info = {{"input_len_range", {in.lo + o.random_prefix_len + n_special, in.hi + o.random_prefix_len + n_special}},
            {"output_len_range", {out.lo, out.hi}},
            {"range_mode", o.random_range_mode},
            {"prefix_len", o.random_prefix_len},
            {"special_tokens_added", n_special},
            {"achieved_input_len", to_json(length_stats(achieved))},
            {"requested_input_len", to_json(length_stats([&] {
               std::vector<int64_t> v;
               for (int64_t x : input_lens) v.push_back(x + o.random_prefix_len + n_special);
               return v;
             }()))},
            {"prompts_off_target", mismatched},
            {"token_mismatch_total", mismatch_tokens}};
  return w;
}

}  // namespace servetune::datasets
