// ShareGPT conversations as sessions (--dataset-name sharegpt --multi-turn): the entries and order of the
// first-turn workload (same reader, same Python shuffle of the seed); turn k of a session is the chat-templated
// history u0 a0 ... uk and its max_tokens the token count of the dataset's reply ak (vLLM's count, BOS included),
// so only (user, reply) pairs become turns. Turn 0 must pass vLLM's filters or the conversation is skipped, as in the
// first-turn workload; a later turn over --sharegpt-max-prompt-len or --sharegpt-max-total-len ends its session
// before that turn, counted in the info and printed (never dropped silently). --multi-turn-max-turns caps turns.
#include <limits>
#include <utility>

#include "datasets/rng.h"
#include "datasets/sessions.h"
#include "datasets/sharegpt_reader.h"
#include "servetune/error.h"

namespace servetune::datasets {

Workload sample_sharegpt_sessions(const DatasetOptions& options, const Tokenizer& tokenizer) {
  DatasetOptions o = options;
  check_session_options(o, tokenizer);
  for (const auto& [flag, text] : {std::pair{"--multi-turn-turns-dist", &o.multi_turn_turns_dist},
                                   {"--multi-turn-input-len-dist", &o.multi_turn_input_len_dist},
                                   {"--multi-turn-output-len-dist", &o.multi_turn_output_len_dist},
                                   {"--multi-turn-prefix-len-dist", &o.multi_turn_prefix_len_dist}}) {
    if (!text->empty()) throw_usage(std::string(flag) + " applies to --dataset-name random (ShareGPT sessions keep their own lengths)");
  }
  const int64_t max_texts = o.multi_turn_max_turns > 0 ? 2 * o.multi_turn_max_turns : std::numeric_limits<int64_t>::max();
  const ShareGptFile file = load_sharegpt(o, max_texts);
  const std::vector<std::vector<std::string>>& data = file.conversations;

  Workload w;
  w.dataset_name = "sharegpt";
  std::vector<size_t> session_start;  // index of each session's first turn in w.requests
  int64_t examined = 0, filtered = 0, cut_sessions = 0, cut_turns = 0;
  for (const std::vector<std::string>& c : data) {
    if (static_cast<int64_t>(session_start.size()) >= o.num_prompts) break;
    ++examined;
    const int64_t session = static_cast<int64_t>(session_start.size());
    std::vector<SampleRequest> turns;
    std::vector<ChatMessage> history;
    const size_t pairs = c.size() / 2;
    for (size_t k = 0; k < pairs; ++k) {
      history.push_back({"user", c[2 * k]});
      SampleRequest r;
      r.messages = history;
      render_turn(tokenizer, r);
      r.output_len = o.sharegpt_output_len ? *o.sharegpt_output_len
                                           : static_cast<int64_t>(tokenizer.encode(c[2 * k + 1], true, false).size());
      if (k == 0 && !is_valid_sequence(r.prompt_len, r.output_len, o, o.sharegpt_output_len.has_value())) break;
      if (k > 0 && (r.prompt_len > o.sharegpt_max_prompt_len || r.prompt_len + r.output_len > o.sharegpt_max_total_len)) {
        ++cut_sessions;
        cut_turns += static_cast<int64_t>(pairs - k);
        break;
      }
      r.session = session;
      r.turn = static_cast<int64_t>(k);
      history.push_back({"assistant", c[2 * k + 1]});
      turns.push_back(std::move(r));
    }
    if (turns.empty()) {
      ++filtered;
      continue;
    }
    session_start.push_back(w.requests.size());
    for (SampleRequest& r : turns) w.requests.push_back(std::move(r));
  }
  const int64_t kept = static_cast<int64_t>(session_start.size());
  int64_t oversampled = 0;
  if (kept < o.num_prompts && !o.no_oversample) {
    if (kept == 0) throw_usage(o.path + ": no conversation passes the ShareGPT length filters; nothing to oversample");
    session_start.push_back(w.requests.size());  // end of the last kept session
    PyRandom rng(o.seed);
    for (int64_t i = 0; kept + i < o.num_prompts; ++i) {
      const size_t pick = rng.choice_index(static_cast<size_t>(kept));
      for (size_t j = session_start[pick]; j < session_start[pick + 1]; ++j) {
        SampleRequest r = w.requests[j];
        r.session = kept + i;
        w.requests.push_back(std::move(r));
      }
      ++oversampled;
    }
  }
  for (size_t i = 0; i < w.requests.size(); ++i) w.requests[i].id = std::to_string(i);
  w.info = sharegpt_info(o, file, {examined, filtered, kept, oversampled});
  w.info["max_turns"] = o.multi_turn_max_turns;
  w.info["sessions_cut_at_length_limit"] = cut_sessions;
  w.info["turns_cut_at_length_limit"] = cut_turns;
  finish_sessions(w, o, tokenizer);
  return w;
}

}  // namespace servetune::datasets
