// Synthetic sessions (--dataset-name random --multi-turn), the shape of vLLM's multi-turn benchmark
// (benchmarks/multi_turn generate_conversations): multi_turn_turns user messages a session, each of
// --random-input-len tokens and each reply of --random-output-len tokens, drawn per turn from the random dataset's
// range-ratio interval; the first user message starts with the prefix all sessions share (--random-prefix-len,
// vLLM's common_prefix_num_tokens), then the session's own prefix (--multi-turn-prefix-len, vLLM's
// prefix_num_tokens). Differences from vLLM: turns count user messages (vLLM's num_turns counts both roles) and
// both prefixes come on top of the first message's input length. All text is token-stable random ids; the
// dataset's replies fill the history in the "dataset" mode.
// Agent-shaped sessions (--multi-turn-system-len, --multi-turn-tool-result-len): a system message every session
// shares (instructions and tool schema) before the first user message (the task), and each later turn a tool result
// of the tool-result length instead of a user message of the input length: long histories growing by a short
// reply and a short result per turn. Tool results are sent as user messages (chat templates disagree on tool roles).
// Length distributions (--multi-turn-*-dist, vLLM's names: length_dist.h) replace turns, the input and output
// lengths and the session prefix length; draws are floored at 1 (turns, input, output) and 0 (prefix).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "datasets/length_dist.h"
#include "datasets/sessions.h"
#include "datasets/token_prompt.h"
#include "servetune/error.h"

namespace servetune::datasets {
namespace {

// Uniform in the random dataset's vLLM-mode interval [floor(L(1-r)), ceil(L(1+r))].
LengthDist range_dist(int64_t len, double r) {
  LengthDist d;
  d.distribution = "uniform";
  d.min = std::floor(static_cast<double>(len) * (1.0 - r));
  d.max = std::ceil(static_cast<double>(len) * (1.0 + r));
  return d;
}

// The distribution a --multi-turn-*-dist flag gives, else `plain` (constant or range: no change to the draws).
LengthDist dist_or(const std::string& text, const char* flag, const LengthDist& plain) {
  return text.empty() ? plain : parse_length_dist(text, flag);
}

LengthDist constant_dist(int64_t v) {
  LengthDist d;
  d.value = static_cast<double>(v);
  return d;
}

}  // namespace

Workload sample_random_sessions(const DatasetOptions& o, const Tokenizer& tokenizer) {
  if (!o.path.empty()) throw_usage("--dataset-name random takes no --dataset-path (" + o.path + ")");
  check_session_options(o, tokenizer);
  if (o.random_range_mode != "vllm") throw_usage("--multi-turn with --dataset-name random takes --random-range-mode vllm");
  if (!(o.random_range_ratio >= 0.0 && o.random_range_ratio < 1.0)) throw_usage("--random-range-ratio must be in [0, 1)");
  if (o.random_input_len < 1) throw_usage("--random-input-len must be >= 1");
  if (o.random_output_len < 1) throw_usage("--random-output-len must be >= 1");
  if (o.random_prefix_len < 0) throw_usage("--random-prefix-len must be >= 0");
  if (o.multi_turn_turns < 1) throw_usage("--multi-turn-turns must be >= 1");
  if (o.multi_turn_prefix_len < 0) throw_usage("--multi-turn-prefix-len must be >= 0");
  if (o.multi_turn_max_turns != 0) throw_usage("--multi-turn-max-turns applies to sharegpt; use --multi-turn-turns");
  if (o.multi_turn_system_len < 0) throw_usage("--multi-turn-system-len must be >= 0");
  if (o.multi_turn_tool_result_len < 0) throw_usage("--multi-turn-tool-result-len must be >= 0");
  const std::vector<int32_t> allowed = allowed_token_ids(tokenizer);
  if (allowed.empty()) throw_usage(tokenizer.source() + ": the vocabulary has no non-special tokens");

  const LengthDist turns_dist = dist_or(o.multi_turn_turns_dist, "--multi-turn-turns-dist", constant_dist(o.multi_turn_turns));
  const LengthDist prefix_dist =
      dist_or(o.multi_turn_prefix_len_dist, "--multi-turn-prefix-len-dist", constant_dist(o.multi_turn_prefix_len));
  const LengthDist in_dist =
      dist_or(o.multi_turn_input_len_dist, "--multi-turn-input-len-dist", range_dist(o.random_input_len, o.random_range_ratio));
  const LengthDist out_dist =
      dist_or(o.multi_turn_output_len_dist, "--multi-turn-output-len-dist", range_dist(o.random_output_len, o.random_range_ratio));
  const LengthDist tool_dist = range_dist(o.multi_turn_tool_result_len, o.random_range_ratio);

  Rng rng(o.seed);
  // "\n" ends each part so that joining texts does not merge tokens across the join.
  const std::string common = o.random_prefix_len > 0 ? random_stable_text(tokenizer, o.random_prefix_len, allowed, rng) + "\n" : "";
  const std::string system = o.multi_turn_system_len > 0 ? random_stable_text(tokenizer, o.multi_turn_system_len, allowed, rng) : "";
  Workload w;
  w.dataset_name = "random";
  for (int64_t s = 0; s < o.num_prompts; ++s) {
    const int64_t turns = std::max<int64_t>(turns_dist.sample(rng), 1);
    const int64_t prefix_len = prefix_dist.sample(rng);
    const std::string own = prefix_len > 0 ? random_stable_text(tokenizer, prefix_len, allowed, rng) + "\n" : "";
    std::vector<ChatMessage> history;
    if (!system.empty()) history.push_back({"system", system});
    for (int64_t t = 0; t < turns; ++t) {
      const bool tool_result = t > 0 && o.multi_turn_tool_result_len > 0;
      const int64_t in_len = std::max<int64_t>((tool_result ? tool_dist : in_dist).sample(rng), 1);
      const int64_t out_len = std::max<int64_t>(out_dist.sample(rng), 1);
      history.push_back({"user", (t == 0 ? common + own : "") + random_stable_text(tokenizer, in_len, allowed, rng)});
      SampleRequest r;
      r.messages = history;
      render_turn(tokenizer, r);
      r.output_len = out_len;
      r.session = s;
      r.turn = t;
      r.id = std::to_string(w.requests.size());
      w.requests.push_back(std::move(r));
      history.push_back({"assistant", random_stable_text(tokenizer, out_len, allowed, rng)});
    }
  }
  w.info = {{"turns_per_session", o.multi_turn_turns},
            {"input_len_per_turn", o.random_input_len},
            {"output_len_per_turn", o.random_output_len},
            {"range_ratio", o.random_range_ratio},
            {"common_prefix_len", o.random_prefix_len},
            {"session_prefix_len", o.multi_turn_prefix_len},
            {"system_len", o.multi_turn_system_len},
            {"tool_result_len", o.multi_turn_tool_result_len}};
  for (const auto& [key, text, dist] : {std::tuple{"turns_dist", &o.multi_turn_turns_dist, &turns_dist},
                                        {"input_len_dist", &o.multi_turn_input_len_dist, &in_dist},
                                        {"output_len_dist", &o.multi_turn_output_len_dist, &out_dist},
                                        {"prefix_len_dist", &o.multi_turn_prefix_len_dist, &prefix_dist}}) {
    if (!text->empty()) w.info[key] = dist->text();
  }
  finish_sessions(w, o, tokenizer);
  return w;
}

}  // namespace servetune::datasets
