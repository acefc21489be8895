// Loads the greedy-continuation goldens written by scripts/gen_model_goldens.py (llama.cpp reference).
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servetune::testing {

struct GoldenCase {
  std::string kind;
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  std::vector<std::vector<std::pair<int32_t, float>>> top5;  // per generated position
};

inline std::vector<GoldenCase> load_golden_cases(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<GoldenCase> cases;
  for (const auto& c : doc.at("cases")) {
    GoldenCase g;
    g.kind = c.at("kind").get<std::string>();
    g.prompt = c.at("prompt").get<std::string>();
    g.prompt_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    g.output_ids = c.at("output_ids").get<std::vector<int32_t>>();
    for (const auto& step : c.at("top5")) {
      std::vector<std::pair<int32_t, float>> row;
      for (const auto& e : step) row.emplace_back(e.at(0).get<int32_t>(), e.at(1).get<float>());
      g.top5.push_back(row);
    }
    cases.push_back(std::move(g));
  }
  return cases;
}

}  // namespace servetune::testing
