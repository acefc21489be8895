// Streaming reader of the ShareGPT JSON file: each entry's "conversations" turn texts (the "value" strings, in
// order, up to a limit), entries with fewer than 2 turns dropped. Shared by the first-turn and multi-turn workloads
// so both see the same entries in the same order (one seed picks the same first turns in both).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "datasets/dataset.h"

namespace servetune::datasets {

struct ShareGptFile {
  // Turn texts of each kept entry: turn 0 is the first human message, turn 1 its reply, and so on by position.
  // Entries whose turn 0 or 1 has no string "value" are dropped (vLLM would raise on them); a later turn without
  // one ends that entry's turns there.
  std::vector<std::vector<std::string>> conversations;
  int64_t entries = 0;            // complete top-level objects
  int64_t dropped_short = 0;      // no "conversations" array or fewer than 2 turns
  int64_t dropped_malformed = 0;  // turn 0 or 1 without a string "value"
  bool truncated = false;         // the file ends inside the top-level array (entries up to there are kept)
};

// Reads `path` keeping at most `max_turns` turn texts per entry (the file is ~125 MB; a DOM would take gigabytes).
// A file cut off inside its top-level array is read up to its last complete entry (truncated = true); any other
// JSON error throws Error(kFormat) naming the file, a missing file Error(kUsage).
ShareGptFile read_sharegpt(const std::string& path, int64_t max_turns);

// What both ShareGPT workloads start with: o.path defaulted, --sharegpt-output-len checked, the file read (a warning
// on stderr when it is truncated) and its conversations shuffled with Python's random.seed(o.seed) unless
// disable_shuffle.
ShareGptFile load_sharegpt(DatasetOptions& o, int64_t max_turns);

struct ShareGptCounts {
  int64_t examined = 0;     // conversations looked at
  int64_t filtered = 0;     // of those, dropped by the length filters
  int64_t kept = 0;
  int64_t oversampled = 0;  // copies drawn to reach num_prompts
};
// The dataset info both ShareGPT workloads record: the file's facts, the counts and the filters.
nlohmann::json sharegpt_info(const DatasetOptions& o, const ShareGptFile& file, const ShareGptCounts& c);

// vLLM's is_valid_sequence: prompt >= min_len, output >= min_len (unless skip_min_output: the output length is an
// override), prompt <= max_prompt_len, prompt + output <= max_total_len.
bool is_valid_sequence(int64_t prompt_len, int64_t output_len, const DatasetOptions& o, bool skip_min_output);

}  // namespace servetune::datasets
