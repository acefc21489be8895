// JSON string escaping with UTF-8 repair, and double formatting (see json_text.h).
#include "server/json_text.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <utility>

namespace servetune::server {
namespace {

// Length of the UTF-8 sequence starting at s[i] and whether it is well-formed (RFC 3629 table 3-7). An ill-formed
// one spans its maximal subpart (the lead byte plus the continuation bytes that were still valid), as the
// tokenizer's decoder counts them, so each becomes one U+FFFD.
std::pair<size_t, bool> utf8_sequence(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // range of the first continuation byte
  if (b0 < 0x80) return {1, true};
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {k, false};
    const auto b = static_cast<uint8_t>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return {k, false};
  }
  return {need + 1, true};
}

template <typename T>
void append_number(std::string& out, T v) {
  if (!std::isfinite(v)) v = static_cast<T>(-9999.0);
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  std::string_view text(buf, static_cast<size_t>(r.ptr - buf));
  out += text;
  // Keep it a float for strict clients: "0" -> "0.0", but never touch exponents or existing dots.
  if (text.find_first_of(".e") == std::string_view::npos) out += ".0";
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.reserve(out.size() + s.size() + 2);
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const auto [n, valid] = utf8_sequence(s, i);
      if (valid) {
        out.append(s.data() + i, n);
      } else {
        out += "\xEF\xBF\xBD";
      }
      i += n;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

void append_json_number(std::string& out, double v) { append_number(out, v); }
void append_json_number(std::string& out, float v) { append_number(out, v); }

}  // namespace servetune::server
