// Typed, strict reading of one mapping of a sweep file: every key is asked for by name, done() rejects the rest,
// and every problem is reported through SpecFile::fail with the full key path. Internal to the sweep-file parser.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuner/spec_file.h"
#include "tuner/sweep_spec.h"

namespace servetune::tuner {

class Section {
 public:
  // `j` must be a mapping (null reads as an empty one); `path` is its dotted key path ("" for the top level).
  Section(const SpecFile& file, const nlohmann::ordered_json& j, std::string path);

  bool has(const std::string& key) const;
  const nlohmann::ordered_json* get(const std::string& key);  // nullptr when absent or null
  std::string str(const std::string& key, const std::string& fallback, bool required = false);
  int64_t int_in(const std::string& key, int64_t fallback, int64_t lo, int64_t hi);
  std::optional<int64_t> opt_int(const std::string& key, int64_t lo);
  double dbl(const std::string& key, double fallback);
  std::optional<double> opt_dbl(const std::string& key);
  bool boolean(const std::string& key, bool fallback);
  std::vector<std::string> str_list(const std::string& key);  // a string or a list of strings
  std::map<std::string, std::string> str_map(const std::string& key);  // scalar values become text

  std::string key_path(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;
  // Unknown keys are an error naming the known ones.
  void done() const;

 private:
  const SpecFile& file_;
  nlohmann::ordered_json j_;
  std::string path_;
  std::set<std::string> asked_;
};

// Parts of the sweep file parsed in their own files.
std::vector<WorkloadSpec> parse_workloads(const SpecFile& file, const nlohmann::ordered_json& list);
ServerSpec parse_server(const SpecFile& file, Section& s, const std::string& path, const std::string& name);

}  // namespace servetune::tuner
