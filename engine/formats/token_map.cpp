// Draft vocabulary files (see token_map.h).
#include "formats/token_map.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace servetune {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw_usage("speculative_token_map " + path + ": " + what);
}

}  // namespace

std::vector<int32_t> read_token_map(const std::string& path, int64_t vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot be read");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  if (text.starts_with("PK") || text.starts_with("\x80")) {
    bad(path, "is a PyTorch file (SGLang's .pt token map); servetune reads a JSON array or whitespace-separated ids: "
              "python3 -c 'import json, torch; print(json.dumps(torch.load(\"" + path + "\").tolist()))' > map.json");
  }
  // A JSON array of integers is the same list with brackets and commas around it.
  std::vector<int32_t> ids;
  size_t i = 0, brackets = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c)) || c == ',') {
      ++i;
    } else if (c == '[' || c == ']') {
      // One '[' before every id and one ']' after them all.
      if (++brackets > 2 || (c == '[') != (brackets == 1) || (c == '[' && !ids.empty())) {
        bad(path, "is not a flat list of token ids");
      }
      ++i;
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '-') {
      if (brackets == 2) bad(path, "has token ids after the JSON array's end");
      size_t end = i + 1;
      while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      const std::string number = text.substr(i, end - i);
      if (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end])) && text[end] != ',' && text[end] != ']') {
        bad(path, "'" + text.substr(i, std::min<size_t>(end + 1 - i, 24)) + "' at byte " + std::to_string(i) +
                      " is not a token id");
      }
      long long id = 0;
      try {
        id = std::stoll(number);
      } catch (const std::exception&) {
        bad(path, "'" + number + "' at byte " + std::to_string(i) + " is not a token id");
      }
      if (id < 0 || id >= vocab) {
        bad(path, "token id " + number + " is outside the target's vocabulary [0, " + std::to_string(vocab) + ")");
      }
      ids.push_back(static_cast<int32_t>(id));
      i = end;
    } else {
      bad(path, "unexpected '" + std::string(1, c) + "' at byte " + std::to_string(i) + " (expected token ids)");
    }
  }
  if (brackets == 1) bad(path, "the JSON array is not closed");
  if (ids.empty()) bad(path, "holds no token ids");
  std::sort(ids.begin(), ids.end());
  if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end()) {
    bad(path, "token id " + std::to_string(*dup) + " appears more than once");
  }
  return ids;
}

}  // namespace servetune
