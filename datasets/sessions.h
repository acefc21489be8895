// Multi-turn workloads' shared parts: a turn's prompt rendered from its messages with the model's chat template,
// the checks every multi-turn dataset makes, and the session facts recorded in the dataset info.
#pragma once

#include "datasets/dataset.h"

namespace servetune::datasets {

// Sets r.prompt to the chat-template rendering of r.messages (generation prompt added) and r.prompt_len to its
// tokens as a chat server counts them: special tokens parsed, no BOS added (the template spells it).
void render_turn(const Tokenizer& tokenizer, SampleRequest& r);

// Throws Error(kUsage) naming the flag for bad multi-turn options, or when the tokenizer has no chat template.
void check_session_options(const DatasetOptions& o, const Tokenizer& tokenizer);

// Marks `w` as sessions with o's history mode (render set for "server") and adds the session facts to w.info:
// sessions, turns, turns per session, first-turn and later-turn prompt lengths.
void finish_sessions(Workload& w, const DatasetOptions& o, const Tokenizer& tokenizer);

}  // namespace servetune::datasets
