// Shared-prefix workload for prefix-cache studies (SGLang's generated-shared-prefix shape): prefix_num_groups
// system prompts of prefix_system_prompt_len tokens; request i uses group i % groups and its own question of
// prefix_question_len tokens, joined as "{system}\n\n{question}"; the order is shuffled with the seed.
#include "datasets/dataset.h"
#include "datasets/token_prompt.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::datasets {
Workload sample_prefix(const DatasetOptions& o, const Tokenizer& tokenizer) {
  if (!o.path.empty()) throw_usage("--dataset-name prefix takes no --dataset-path (" + o.path + ")");
  if (o.prefix_num_groups < 1) throw_usage("--prefix-num-groups must be >= 1");
  if (o.prefix_system_prompt_len < 1) throw_usage("--prefix-system-prompt-len must be >= 1");
  if (o.prefix_question_len < 1) throw_usage("--prefix-question-len must be >= 1");
  if (o.prefix_output_len < 1) throw_usage("--prefix-output-len must be >= 1");
  const std::vector<int32_t> allowed = allowed_token_ids(tokenizer);
  Rng rng(o.seed);
  std::vector<std::string> systems;
  for (int64_t g = 0; g < o.prefix_num_groups; ++g) {
    systems.push_back(random_stable_text(tokenizer, o.prefix_system_prompt_len, allowed, rng));
  }
  Workload w;
  w.dataset_name = "prefix";
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    SampleRequest r;
    r.prompt = systems[static_cast<size_t>(i % o.prefix_num_groups)] + "\n\n" +
               random_stable_text(tokenizer, o.prefix_question_len, allowed, rng);
    r.prompt_len = static_cast<int64_t>(tokenizer.encode(r.prompt, true, false).size());
    r.output_len = o.prefix_output_len;
    w.requests.push_back(std::move(r));
  }
  rng.shuffle(w.requests);
  std::vector<int64_t> achieved;
  for (size_t i = 0; i < w.requests.size(); ++i) {
    w.requests[i].id = std::to_string(i);
    achieved.push_back(w.requests[i].prompt_len);
  }
  w.info = {{"num_groups", o.prefix_num_groups},
            {"system_prompt_len", o.prefix_system_prompt_len},
            {"question_len", o.prefix_question_len},
            {"output_len", o.prefix_output_len},
            {"achieved_input_len", to_json(length_stats(achieved))}};
  return w;
}

}  // namespace servetune::datasets
