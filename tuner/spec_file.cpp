// YAML / JSON sweep-file reader (see spec_file.h).
#include "tuner/spec_file.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "servetune/error.h"

namespace servetune::tuner {
namespace {

// YAML 1.2 core schema for plain scalars.
nlohmann::ordered_json plain_scalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf") return std::numeric_limits<double>::infinity();
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return -std::numeric_limits<double>::infinity();
  const char* b = s.c_str();
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(b, &end, 10);
  if (*end == '\0' && errno == 0 && s.find_first_of("0123456789") != std::string::npos) return i;
  errno = 0;
  const double d = std::strtod(b, &end);
  const bool numeric_chars = s.find_first_not_of("0123456789+-.eE") == std::string::npos;
  if (*end == '\0' && errno == 0 && numeric_chars && s.find_first_of("0123456789") != std::string::npos) return d;
  return s;
}

nlohmann::ordered_json convert(const YAML::Node& node, const std::string& path, SpecFile& out) {
  if (!path.empty()) out.lines.emplace(path, node.Mark().line + 1);
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!") return node.Scalar();  // quoted
      return plain_scalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      size_t i = 0;
      for (const YAML::Node& item : node) {
        a.push_back(convert(item, path + "[" + std::to_string(i++) + "]", out));
      }
      return a;
    }
    case YAML::NodeType::Map: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& kv : node) {
        const std::string key = kv.first.Scalar();
        const std::string child = path.empty() ? key : path + "." + key;
        if (o.contains(key)) {
          out.lines.emplace(child, kv.first.Mark().line + 1);
          out.fail(child, "duplicate key");
        }
        out.lines[child] = kv.first.Mark().line + 1;
        o[key] = convert(kv.second, child, out);
        out.lines[child] = kv.first.Mark().line + 1;
      }
      return o;
    }
  }
  return nullptr;
}

// JSON has no line table; record the key paths so messages still name them.
void index_json(const nlohmann::ordered_json& j, const std::string& path, SpecFile& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) index_json(v, path.empty() ? k : path + "." + k, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) index_json(j[i], path + "[" + std::to_string(i) + "]", out);
  }
}

}  // namespace

void SpecFile::fail(const std::string& key, const std::string& problem) const {
  std::string where = path;
  if (!key.empty()) {
    where += ": " + key;
    const auto it = lines.find(key);
    if (it != lines.end() && it->second > 0) where += " (line " + std::to_string(it->second) + ")";
  }
  throw Error(ErrorKind::kUsage, where + ": " + problem);
}

SpecFile parse_spec_text(const std::string& text, const std::string& name) {
  SpecFile out;
  out.path = name;
  const size_t first = text.find_first_not_of(" \t\r\n");
  const bool json = (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) ||
                    (first != std::string::npos && text[first] == '{');
  if (json) {
    try {
      out.root = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(ErrorKind::kUsage, name + ": not valid JSON: " + e.what());
    }
    index_json(out.root, "", out);
  } else {
    YAML::Node node;
    try {
      node = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw Error(ErrorKind::kUsage, name + ": line " + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
    }
    out.root = convert(node, "", out);
  }
  if (!out.root.is_object()) throw Error(ErrorKind::kUsage, name + ": a sweep file must be a mapping of keys (name, target, space, ...)");
  return out;
}

SpecFile load_spec_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_usage(path + ": cannot open the sweep file (no such file, or not readable)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_spec_text(ss.str(), path);
}

}  // namespace servetune::tuner
