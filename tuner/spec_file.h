// Reads a sweep file (YAML through yaml-cpp, or JSON) into one JSON value plus the source line of every key, so
// validation can name the file, the key path and the line in one message. Same schema for both syntaxes.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace servetune::tuner {

struct SpecFile {
  std::string path;
  nlohmann::ordered_json root;
  std::map<std::string, int> lines;  // dotted key path ("space.tp_size", "workloads[1].name") -> 1-based line

  // Throws Error(kUsage): "<path>: <key> (line N): <problem>".
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const;
};

// Loads `path`; a .json file (or text starting with '{') is parsed as JSON, anything else as YAML. Plain YAML
// scalars become booleans, integers, floats or null as YAML 1.2's core schema reads them; quoted ones stay strings.
// Throws Error(kIo) for a missing file and Error(kUsage) naming the line for a syntax error.
SpecFile load_spec_file(const std::string& path);
// The same from text (`name` is used in messages).
SpecFile parse_spec_text(const std::string& text, const std::string& name);

}  // namespace servetune::tuner
