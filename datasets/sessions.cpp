// Multi-turn workload helpers (see sessions.h).
#include "datasets/sessions.h"

#include "servetune/error.h"

namespace servetune::datasets {

void render_turn(const Tokenizer& tokenizer, SampleRequest& r) {
  r.prompt = apply_chat_template(tokenizer, r.messages, /*add_generation_prompt=*/true);
  r.prompt_len = static_cast<int64_t>(tokenizer.encode(r.prompt, /*add_special=*/false, /*parse_special=*/true).size());
}

void check_session_options(const DatasetOptions& o, const Tokenizer& tokenizer) {
  if (o.multi_turn_history != "dataset" && o.multi_turn_history != "server") {
    throw_usage("--multi-turn-history must be dataset or server, got '" + o.multi_turn_history + "'");
  }
  if (o.multi_turn_max_turns < 0) throw_usage("--multi-turn-max-turns must be >= 0 (0: no limit)");
  try {
    (void)apply_chat_template(tokenizer, {{"user", "x"}}, true);
  } catch (const Error& e) {
    throw_usage(std::string("--multi-turn sends chat-templated histories, which needs the model's chat template: ") +
                e.what());
  }
}

void finish_sessions(Workload& w, const DatasetOptions& o, const Tokenizer& tokenizer) {
  w.sessions = true;
  w.history = o.multi_turn_history;
  if (w.history == "server") {
    const Tokenizer* tok = &tokenizer;
    w.render = [tok](SampleRequest& r) { render_turn(*tok, r); };
  }
  std::vector<int64_t> turns, first, later;
  for (const SampleRequest& r : w.requests) {
    if (r.turn == 0 || turns.empty()) {
      turns.push_back(0);
      first.push_back(r.prompt_len);
    } else {
      later.push_back(r.prompt_len);
    }
    ++turns.back();
  }
  w.info["sessions"] = static_cast<int64_t>(turns.size());
  w.info["turns"] = static_cast<int64_t>(w.requests.size());
  w.info["turns_per_session"] = to_json(length_stats(turns));
  w.info["first_turn_input_len"] = to_json(length_stats(first));
  w.info["later_turn_input_len"] = to_json(length_stats(later));
  w.info["history"] = w.history;
  if (w.history == "server") {
    w.info["history_note"] = "later turns' prompt lengths are those of the dataset's replies; the server's replies "
                             "replace them when sent";
  }
}

}  // namespace servetune::datasets
