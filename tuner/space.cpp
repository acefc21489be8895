// Search space enumeration and candidate validity (see space.h).
#include "tuner/space.h"

#include <algorithm>
#include <limits>

#include "servetune/error.h"
#include "servetune/model_info.h"
#include "tuner/server_command.h"

namespace servetune::tuner {
namespace {

std::string value_label(const nlohmann::ordered_json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

std::optional<int64_t> int_setting(const nlohmann::ordered_json& s, const std::string& key) {
  const auto it = s.find(key);
  if (it == s.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

// With DP attention the dp_size replicas are the tp_size ranks themselves (SGLang's --dp with --enable-dp-attention).
bool dp_attention_on(const nlohmann::ordered_json& vars) {
  const auto it = vars.find("enable_dp_attention");
  return it != vars.end() && it->is_boolean() && it->get<bool>();
}

int64_t devices_of(const nlohmann::ordered_json& vars) {
  const int64_t tp = int_setting(vars, "tp_size").value_or(1), dp = int_setting(vars, "dp_size").value_or(1);
  return dp_attention_on(vars) ? tp : tp * dp;
}

}  // namespace

SearchSpace::SearchSpace(const SweepSpec& spec) : spec_(spec) {
  for (const Dimension& d : spec.space) {
    if (size_ > std::numeric_limits<size_t>::max() / d.values.size()) throw_usage(spec.source + ": space: too many combinations");
    size_ *= d.values.size();
  }
  id_width_ = std::to_string(size_ > 0 ? size_ - 1 : 0).size();
  for (size_t i = 0; i < spec.constraints.size(); ++i) {
    try {
      constraints_.push_back(Expr::parse(spec.constraints[i]));
    } catch (const Error& e) {
      throw_usage(spec.source + ": constraints[" + std::to_string(i) + "]: " + e.what());
    }
  }
}

Candidate SearchSpace::at(size_t index) const {
  if (index >= size_) throw Error(ErrorKind::kInternal, "candidate index out of range");
  Candidate c;
  c.index = index;
  std::string id = std::to_string(index);
  c.id = "c" + std::string(id_width_ - id.size(), '0') + id;
  size_t rest = index;
  std::vector<size_t> digits(spec_.space.size());
  for (size_t i = spec_.space.size(); i-- > 0;) {
    digits[i] = rest % spec_.space[i].values.size();
    rest /= spec_.space[i].values.size();
  }
  for (size_t i = 0; i < spec_.space.size(); ++i) {
    const Dimension& d = spec_.space[i];
    c.settings[d.name] = d.values[digits[i]];
    if (d.values.size() > 1) c.label += (c.label.empty() ? "" : ", ") + d.name + "=" + value_label(d.values[digits[i]]);
  }
  if (c.label.empty()) c.label = "baseline";
  c.skip_reason = check(c);
  return c;
}

Candidate SearchSpace::find(const nlohmann::ordered_json& settings) const {
  size_t index = 0;
  for (const Dimension& d : spec_.space) {
    const nlohmann::ordered_json& v = settings.contains(d.name) ? settings.at(d.name) : spec_.baseline.at(d.name);
    const auto it = std::find(d.values.begin(), d.values.end(), v);
    if (it == d.values.end()) throw Error(ErrorKind::kInternal, "value " + v.dump() + " is not in space." + d.name);
    index = index * d.values.size() + static_cast<size_t>(it - d.values.begin());
  }
  return at(index);
}

nlohmann::ordered_json SearchSpace::full_settings(const Candidate& c) const {
  nlohmann::ordered_json s = spec_.target.settings;
  for (const auto& [k, v] : c.settings.items()) s[k] = v;
  return s;
}

EngineConfig SearchSpace::engine_config(const Candidate& c) const {
  nlohmann::ordered_json j = full_settings(c);
  j["model"] = spec_.target.model;
  return j.get<EngineConfig>();
}

const std::optional<ModelInfo>& SearchSpace::model_shape() const {
  if (!model_shape_read_) {
    model_shape_read_ = true;
    try {
      nlohmann::ordered_json fixed = spec_.target.settings;
      fixed["model"] = spec_.target.model;
      const EngineConfig config = fixed.get<EngineConfig>();
      model_shape_ = read_model_info(config.model, config.load_format);
    } catch (const Error&) {
      model_shape_.reset();
    }
  }
  return model_shape_;
}

int64_t SearchSpace::devices_needed(const Candidate& c) const {
  const nlohmann::ordered_json settings = full_settings(c);
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  for (const auto& [k, v] : settings.items()) vars[underscored(k)] = v;
  return devices_of(vars);
}

std::string SearchSpace::check(const Candidate& c) const {
  const nlohmann::ordered_json settings = full_settings(c);
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  if (spec_.builtin()) {
    vars = EngineConfig{};
    vars["model"] = spec_.target.model;
  }
  for (const auto& [k, v] : settings.items()) vars[underscored(k)] = v;
  if (spec_.target.devices) vars["devices"] = *spec_.target.devices;
  if (spec_.target.num_experts) vars["num_experts"] = *spec_.target.num_experts;
  const auto lookup = [&](const std::string& name) -> std::optional<ExprValue> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return expr_value_of(*it);
  };
  for (size_t i = 0; i < constraints_.size(); ++i) {
    bool ok = false;
    try {
      ok = constraints_[i].test(lookup);
    } catch (const Error& e) {
      throw_usage(spec_.source + ": constraints[" + std::to_string(i) + "]: for " + c.label + ": " + e.what());
    }
    if (!ok) return "constraint '" + constraints_[i].text() + "' is false";
  }
  const bool replicas_are_ranks = dp_attention_on(vars);
  const int64_t devices = devices_of(vars);
  if (spec_.target.devices && devices > *spec_.target.devices) {
    return std::string(replicas_are_ranks ? "tp_size" : "tp_size x dp_size") + " = " + std::to_string(devices) + " exceeds the " +
           std::to_string(*spec_.target.devices) + " devices";
  }
  const int64_t ep = int_setting(vars, "ep_size").value_or(1);
  const int64_t redundant = int_setting(vars, "ep_num_redundant_experts").value_or(0);
  if (spec_.target.num_experts && ep > 0 && (*spec_.target.num_experts + redundant) % ep != 0) {
    return "ep_size = " + std::to_string(ep) + " does not divide the " + std::to_string(*spec_.target.num_experts) + " experts" +
           (redundant > 0 ? " + " + std::to_string(redundant) + " redundant ones" : "");
  }
  if (spec_.builtin()) {
    const EngineConfig config = engine_config(c);
    try {
      config.validate();
    } catch (const Error& e) {
      // Unsupported settings and combinations that do not fit (tp x dp over the threads, ...) are skipped; a bad
      // value on its own is a mistake in the sweep file.
      if (e.kind() == ErrorKind::kUnsupported) return std::string("the engine rejects it: ") + e.what();
      const std::string problem = config.combination_problem();
      if (!problem.empty() && problem == e.what()) return "the engine rejects it: " + problem;
      throw_usage(spec_.source + ": space: the candidate " + c.label + " is not a valid engine config: " + e.what());
    }
    if (config.tp_size > 1 && model_shape()) {
      try {
        check_tensor_parallel_split(*model_shape(), config.tp_size, config.ep_size, config.enable_dp_attention,
                                    config.ep_num_redundant_experts);
      } catch (const Error& e) {
        return std::string("the engine rejects it: ") + e.what();
      }
    }
    return "";
  }
  std::string why;
  if (!render_launch(spec_, settings, spec_.target.port == 0 ? 8000 : spec_.target.port, why)) return why;
  return "";
}

}  // namespace servetune::tuner
