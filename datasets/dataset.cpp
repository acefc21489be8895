// Dataset dispatch and length statistics (see dataset.h).
#include "datasets/dataset.h"

#include <cmath>

#include "servetune/error.h"

namespace servetune::datasets {

LengthStats length_stats(const std::vector<int64_t>& values) {
  LengthStats s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  s.min = s.max = values.front();
  for (int64_t v : values) {
    s.total += v;
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
  }
  s.mean = static_cast<double>(s.total) / static_cast<double>(s.count);
  double ss = 0.0;
  for (int64_t v : values) ss += (static_cast<double>(v) - s.mean) * (static_cast<double>(v) - s.mean);
  s.std = std::sqrt(ss / static_cast<double>(s.count));
  return s;
}

nlohmann::json to_json(const LengthStats& s) {
  return {{"count", s.count}, {"total", s.total}, {"min", s.min}, {"max", s.max}, {"mean", s.mean}, {"std", s.std}};
}

Workload load_workload(const DatasetOptions& o, const Tokenizer& tokenizer) {
  if (o.num_prompts < 1) throw_usage("--num-prompts must be >= 1");
  if (o.multi_turn && o.name != "sharegpt" && o.name != "random") {
    throw_usage("--multi-turn applies to --dataset-name sharegpt or random, not " + o.name);
  }
  if (!o.multi_turn && (o.multi_turn_history != "dataset" || o.multi_turn_max_turns != 0 || o.multi_turn_turns != 4 ||
                        o.multi_turn_prefix_len != 0 || o.multi_turn_system_len != 0 || o.multi_turn_tool_result_len != 0)) {
    throw_usage("--multi-turn-* options need --multi-turn");
  }
  Workload w;
  if (o.name == "sharegpt") {
    w = sample_sharegpt(o, tokenizer);
  } else if (o.name == "random") {
    w = sample_random(o, tokenizer);
  } else if (o.name == "trace") {
    w = sample_trace(o, tokenizer);
  } else if (o.name == "prefix") {
    w = sample_prefix(o, tokenizer);
  } else {
    throw_usage("--dataset-name must be one of sharegpt, random, trace, prefix; got '" + o.name + "'");
  }
  std::vector<int64_t> in, out;
  for (const SampleRequest& r : w.requests) {
    in.push_back(r.prompt_len);
    out.push_back(r.output_len);
  }
  w.info["input_len"] = to_json(length_stats(in));
  w.info["output_len"] = to_json(length_stats(out));
  w.info["seed"] = o.seed;
  return w;
}

}  // namespace servetune::datasets
