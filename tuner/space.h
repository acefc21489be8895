// The search space: the cartesian product of the sweep file's dimensions. A candidate is one point, named by its
// mixed-radix index ("c07"), so every strategy and every resumed run gives the same point the same id. Candidates
// that break a constraint or a validity rule (tp x dp over the device count, ep not dividing the experts, a
// setting the built-in engine or the server cannot honour, a tp_size the built-in engine's model cannot be split into)
// carry the reason they are skipped.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "servetune/engine_config.h"
#include "servetune/model_info.h"
#include "tuner/expr.h"
#include "tuner/sweep_spec.h"

namespace servetune::tuner {

struct Candidate {
  std::string id;
  size_t index = 0;
  nlohmann::ordered_json settings = nlohmann::ordered_json::object();  // one value per dimension
  std::string label;        // "name=value, ..." over the dimensions that have several values ("baseline" if none)
  std::string skip_reason;  // non-empty: the candidate is not run
};

class SearchSpace {
 public:
  // Parses the constraints; throws Error(kUsage) naming the sweep file for a bad one.
  explicit SearchSpace(const SweepSpec& spec);

  size_t size() const { return size_; }
  Candidate at(size_t index) const;
  // The point with these dimension values (missing dimensions: the baseline's).
  Candidate find(const nlohmann::ordered_json& settings) const;
  Candidate baseline() const { return find(spec_.baseline); }

  // Fixed target settings overlaid with the candidate's.
  nlohmann::ordered_json full_settings(const Candidate& c) const;
  // The built-in engine's config for a candidate (model and fixed settings included).
  EngineConfig engine_config(const Candidate& c) const;
  // The target model's shape, read once; nullopt when it cannot be read here (the launch reports why).
  const std::optional<ModelInfo>& model_shape() const;
  // Devices (GPUs) one launch of the candidate occupies: tp_size x dp_size, or tp_size with DP attention (whose dp_size
  // replicas are the tp_size ranks).
  int64_t devices_needed(const Candidate& c) const;

 private:
  std::string check(const Candidate& c) const;

  const SweepSpec& spec_;
  std::vector<Expr> constraints_;
  size_t size_ = 1;
  size_t id_width_ = 1;
  mutable bool model_shape_read_ = false;
  mutable std::optional<ModelInfo> model_shape_;
};

}  // namespace servetune::tuner
