// Strict typed reader for sweep-file mappings (see spec_section.h).
#include "tuner/spec_section.h"

namespace servetune::tuner {

Section::Section(const SpecFile& file, const nlohmann::ordered_json& j, std::string path)
    : file_(file), j_(j.is_null() ? nlohmann::ordered_json::object() : j), path_(std::move(path)) {
  if (!j_.is_object()) file_.fail(path_, "must be a mapping of keys, got " + std::string(j.type_name()));
}

bool Section::has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }

const nlohmann::ordered_json* Section::get(const std::string& key) {
  asked_.insert(key);
  const auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string Section::key_path(const std::string& key) const {
  if (key.empty()) return path_;
  return path_.empty() ? key : path_ + "." + key;
}

void Section::fail(const std::string& key, const std::string& problem) const { file_.fail(key_path(key), problem); }

std::string Section::str(const std::string& key, const std::string& fallback, bool required) {
  const auto* v = get(key);
  if (v == nullptr) {
    if (required) fail(key, "missing (required)");
    return fallback;
  }
  if (v->is_string()) return v->get<std::string>();
  if (v->is_number() || v->is_boolean()) return v->dump();
  fail(key, "must be text, got " + std::string(v->type_name()));
}

int64_t Section::int_in(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) {
  const auto* v = get(key);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) fail(key, "must be an integer, got " + v->dump());
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(x));
  return x;
}

std::optional<int64_t> Section::opt_int(const std::string& key, int64_t lo) {
  if (!has(key)) {
    asked_.insert(key);
    return std::nullopt;
  }
  return int_in(key, 0, lo, INT64_MAX);
}

double Section::dbl(const std::string& key, double fallback) {
  const auto v = opt_dbl(key);
  return v ? *v : fallback;
}

std::optional<double> Section::opt_dbl(const std::string& key) {
  const auto* v = get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) fail(key, "must be a number, got " + v->dump());
  return v->get<double>();
}

bool Section::boolean(const std::string& key, bool fallback) {
  const auto* v = get(key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) fail(key, "must be true or false, got " + v->dump());
  return v->get<bool>();
}

std::vector<std::string> Section::str_list(const std::string& key) {
  const auto* v = get(key);
  std::vector<std::string> out;
  if (v == nullptr) return out;
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) fail(key, "must be a list of text");
  for (const auto& item : *v) {
    if (!item.is_string()) fail(key, "must be a list of text, found " + item.dump());
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::map<std::string, std::string> Section::str_map(const std::string& key) {
  const auto* v = get(key);
  std::map<std::string, std::string> out;
  if (v == nullptr) return out;
  if (!v->is_object()) fail(key, "must be a mapping of NAME: value");
  for (const auto& [k, item] : v->items()) {
    if (item.is_string()) {
      out[k] = item.get<std::string>();
    } else if (item.is_number() || item.is_boolean()) {
      out[k] = item.dump();
    } else {
      fail(key + "." + k, "must be text or a number");
    }
  }
  return out;
}

void Section::done() const {
  for (const auto& [k, v] : j_.items()) {
    if (asked_.count(k)) continue;
    std::string known;
    for (const auto& a : asked_) known += (known.empty() ? "" : ", ") + a;
    fail(k, "unknown key '" + k + "'" + (known.empty() ? "" : " (known here: " + known + ")"));
  }
}

}  // namespace servetune::tuner
