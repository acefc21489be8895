// Benchmark workloads: the requests a dataset produces (prompt text, the prompt length the server will see,
// max_tokens, optional trace arrival time; for multi-turn workloads the session and turn each request belongs to)
// and the options that select and shape them. Same options, same seed, same tokenizer: same requests everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "servetune/tokenizer.h"

namespace servetune::datasets {

struct SampleRequest {
  std::string prompt;               // text sent to the server (valid UTF-8)
  int64_t prompt_len = 0;           // tokens the server sees: encode(prompt) with the model's special tokens
  int64_t output_len = 0;           // max_tokens
  std::optional<double> arrival_s;  // trace replay: seconds after the start of the run
  std::string id;
  // Multi-turn workloads: the session this request is a turn of (-1: none) and the turn's index from 0. A session's
  // turns are consecutive in Workload::requests, in turn order.
  int64_t session = -1;
  int64_t turn = 0;
  // Multi-turn: the conversation up to and including this turn's user message; `prompt` is its chat-templated
  // rendering (special tokens as text, generation prompt added). Its assistant entries are the dataset's replies.
  std::vector<ChatMessage> messages;
};

struct LengthStats {
  int64_t count = 0;
  int64_t total = 0;
  int64_t min = 0;
  int64_t max = 0;
  double mean = 0.0;
  double std = 0.0;  // population standard deviation
};
LengthStats length_stats(const std::vector<int64_t>& values);
nlohmann::json to_json(const LengthStats& s);

struct Workload {
  std::string dataset_name;
  std::vector<SampleRequest> requests;
  bool timed = false;   // requests carry arrival_s (trace replay)
  nlohmann::json info;  // dataset-specific facts for the result JSON (filters, achieved lengths, ...)
  // Multi-turn: requests are turns of sessions (SampleRequest::session). history "dataset": every turn is sent as
  // generated (its history holds the dataset's replies); "server": a turn's history holds the replies the server
  // gave to the session's earlier turns in this run, rendered by `render` when the turn is sent.
  bool sessions = false;
  std::string history;
  // Renders a turn whose messages changed (history "server"): sets prompt and prompt_len from messages. Refers to
  // the tokenizer the workload was made with, which must outlive its use.
  std::function<void(SampleRequest&)> render;
};

struct DatasetOptions {
  std::string name = "random";  // sharegpt | random | trace | prefix
  std::string path;             // sharegpt / trace file (sharegpt: default_sharegpt_path() when empty)
  int64_t num_prompts = 1000;
  uint64_t seed = 0;

  // sharegpt (vLLM's rules and defaults)
  std::optional<int64_t> sharegpt_output_len;
  int64_t sharegpt_min_len = 4;
  int64_t sharegpt_max_prompt_len = 1024;
  int64_t sharegpt_max_total_len = 2048;
  bool disable_shuffle = false;
  bool no_oversample = false;

  // multi-turn (sharegpt, random): num_prompts counts sessions; each turn's prompt is the chat-templated history
  bool multi_turn = false;
  std::string multi_turn_history = "dataset";  // dataset | server (see Workload::history)
  int64_t multi_turn_max_turns = 0;            // sharegpt: at most this many turns (user messages) a session; 0: all
  int64_t multi_turn_turns = 4;                // random: turns (user messages) a session
  int64_t multi_turn_prefix_len = 0;           // random: tokens of a per-session prefix in the first user message
  // random, agent-shaped sessions: a system prompt (instructions + tool schema) every session shares, and turns after
  // the first that are short tool results instead of --random-input-len user messages (0: off).
  int64_t multi_turn_system_len = 0;
  int64_t multi_turn_tool_result_len = 0;
  // random: distributions (parse_length_dist text, vLLM's names) replacing a fixed or range-ratio length: turns a
  // session, tokens of each user message, of each reply, of each session's own prefix. Empty: the plain options.
  std::string multi_turn_turns_dist;
  std::string multi_turn_input_len_dist;
  std::string multi_turn_output_len_dist;
  std::string multi_turn_prefix_len_dist;

  // random
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;
  double random_range_ratio = 0.0;
  std::string random_range_mode = "vllm";  // vllm: [L(1-r), L(1+r)]; sglang: [max(L*r, 1), L]
  int64_t random_prefix_len = 0;  // --multi-turn: the prefix all sessions share, in their first user message

  // trace (Mooncake JSONL)
  double trace_time_scale = 1.0;  // arrival offsets are multiplied by this (0.5 replays twice as fast)
  int64_t trace_block_size = 512;  // tokens per hash id

  // prefix (groups sharing a system prompt)
  int64_t prefix_num_groups = 64;
  int64_t prefix_system_prompt_len = 2048;
  int64_t prefix_question_len = 128;
  int64_t prefix_output_len = 256;
};

// The ShareGPT V3 file scripts/setup.sh fetches into this source tree.
std::string default_sharegpt_path();

// Throws Error(kUsage) for bad option values, Error(kIo)/Error(kFormat) naming the file for a missing or malformed
// dataset file.
Workload load_workload(const DatasetOptions& options, const Tokenizer& tokenizer);

Workload sample_sharegpt(const DatasetOptions& options, const Tokenizer& tokenizer);
Workload sample_sharegpt_sessions(const DatasetOptions& options, const Tokenizer& tokenizer);
Workload sample_random(const DatasetOptions& options, const Tokenizer& tokenizer);
Workload sample_random_sessions(const DatasetOptions& options, const Tokenizer& tokenizer);
Workload sample_trace(const DatasetOptions& options, const Tokenizer& tokenizer);
Workload sample_prefix(const DatasetOptions& options, const Tokenizer& tokenizer);

}  // namespace servetune::datasets
