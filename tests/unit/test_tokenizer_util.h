// Helpers for the tokenizer tests: golden JSON loading, FNV-1a 64 of id sequences (as the golden script
// computes it), readable dumps of texts and ids, and the ShareGPT prompt selection of the golden script.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace servetune::testing {

inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

inline std::string fnv1a64_hex(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    auto u = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) {
      h ^= (u >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

inline std::string fnv1a64_hex(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// A golden case's input bytes: "text" (UTF-8) or "hex".
inline std::string case_text(const nlohmann::json& c) {
  return c.contains("text") ? c["text"].get<std::string>() : from_hex(c["hex"].get<std::string>());
}

inline std::string escaped(const std::string& s, size_t max = 120) {
  std::string out;
  for (unsigned char c : s.substr(0, max)) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return s.size() > max ? out + "..." : out;
}

inline std::string ids_str(const std::vector<int32_t>& ids, size_t max = 64) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size() && i < max; ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + (ids.size() > max ? ", ...]" : "]");
}

// First non-empty human turn of each conversation, in file order, as (conversation index, text). The
// ShareGPT file that setup fetches is truncated, so records are cut out one by one and parsed alone.
inline std::vector<std::pair<int64_t, std::string>> sharegpt_prompts(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  std::string buf(64u << 20, '\0');
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  buf.resize(static_cast<size_t>(in.gcount()));
  std::vector<std::pair<int64_t, std::string>> out;
  size_t pos = buf.find('[');
  if (pos == std::string::npos) return out;
  ++pos;
  int64_t index = 0;
  while (out.size() < count && pos < buf.size()) {
    size_t start = buf.find('{', pos);
    if (start == std::string::npos) break;
    int depth = 0;
    bool in_string = false;
    size_t end = start;
    for (; end < buf.size(); ++end) {
      char c = buf[end];
      if (in_string) {
        if (c == '\\') {
          ++end;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{') {
        ++depth;
      } else if (c == '}' && --depth == 0) {
        break;
      }
    }
    if (end >= buf.size()) break;
    nlohmann::json rec = nlohmann::json::parse(buf.substr(start, end + 1 - start));
    for (const auto& m : rec.value("conversations", nlohmann::json::array())) {
      if (m.value("from", "") == "human") {
        std::string v = m.value("value", "");
        if (!v.empty()) out.emplace_back(index, v);
        break;
      }
    }
    ++index;
    pos = end + 1;
  }
  return out;
}

}  // namespace servetune::testing
