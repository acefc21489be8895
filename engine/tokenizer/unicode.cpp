// Unicode helpers: class lookup table built once from the generated ranges, lenient and strict UTF-8
// decoding, and the GPT-2 byte-level map.
#include "tokenizer/unicode.h"

#include <array>
#include <vector>

namespace servetune::unicode {
namespace {

std::vector<uint8_t> build_class_table() {
  std::vector<uint8_t> table(kMaxCodepoint + 1, kUndefined);
  for (size_t i = 0; i < kRangeTableSize; ++i) {
    uint32_t begin = kRangeTable[i] >> 8;
    uint32_t end = i + 1 < kRangeTableSize ? (kRangeTable[i + 1] >> 8) : kMaxCodepoint + 1;
    auto flags = static_cast<uint8_t>(kRangeTable[i] & 0xFF);
    for (uint32_t cp = begin; cp < end && cp <= kMaxCodepoint; ++cp) table[cp] = flags;
  }
  return table;
}

struct ByteMap {
  std::array<std::string, 256> to_text;
  std::array<int16_t, 512> from_cp{};  // printable codepoints of the map are all < 0x144

  ByteMap() {
    from_cp.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : static_cast<uint32_t>(next++);
      to_text[b] = to_utf8(cp);
      from_cp[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

inline bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

uint8_t cp_class(uint32_t cp) {
  static const std::vector<uint8_t> table = build_class_table();
  return cp <= kMaxCodepoint ? table[cp] : uint8_t{kUndefined};
}

uint32_t decode_lenient(std::string_view text, size_t pos, size_t& len) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b0 = s[pos];
  len = 1;
  if (b0 < 0x80) return b0;
  if ((b0 & 0x40) == 0) return kReplacementChar;
  if ((b0 & 0x20) == 0) {
    if (pos + 1 >= n || !is_cont(s[pos + 1])) return kReplacementChar;
    len = 2;
    return (uint32_t{b0 & 0x1Fu} << 6) | (s[pos + 1] & 0x3Fu);
  }
  if ((b0 & 0x10) == 0) {
    if (pos + 2 >= n || !is_cont(s[pos + 1]) || !is_cont(s[pos + 2])) return kReplacementChar;
    len = 3;
    return (uint32_t{b0 & 0x0Fu} << 12) | (uint32_t{s[pos + 1] & 0x3Fu} << 6) | (s[pos + 2] & 0x3Fu);
  }
  if ((b0 & 0x08) == 0) {
    if (pos + 3 >= n || !is_cont(s[pos + 1]) || !is_cont(s[pos + 2]) || !is_cont(s[pos + 3])) return kReplacementChar;
    uint32_t cp = (uint32_t{b0 & 0x07u} << 18) | (uint32_t{s[pos + 1] & 0x3Fu} << 12) |
                  (uint32_t{s[pos + 2] & 0x3Fu} << 6) | (s[pos + 3] & 0x3Fu);
    if (cp > kMaxCodepoint) return kReplacementChar;
    len = 4;
    return cp;
  }
  return kReplacementChar;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_canonical_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    if (s[pos] < 0x80) {
      ++pos;
      continue;
    }
    size_t len = 0;
    uint32_t cp = decode_lenient(text, pos, len);
    size_t expect = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (cp < 0x80 || len != expect || (cp == kReplacementChar && len == 1)) return false;
    pos += len;
  }
  return true;
}

std::string canonicalize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    append_utf8(out, decode_lenient(text, pos, len));
    pos += len;
  }
  return out;
}

Utf8Step utf8_step(std::string_view text, size_t pos, size_t& len) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b0 = s[pos];
  len = 1;
  if (b0 < 0x80) return Utf8Step::kOk;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
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
    return Utf8Step::kInvalid;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= n) {
      len = k;
      return Utf8Step::kIncomplete;
    }
    uint8_t b = s[pos + k];
    bool ok = k == 1 ? (b >= lo && b <= hi) : is_cont(b);
    if (!ok) {
      len = k;
      return Utf8Step::kInvalid;
    }
  }
  len = need + 1;
  return Utf8Step::kOk;
}

bool is_valid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    if (utf8_step(text, pos, len) != Utf8Step::kOk) return false;
    pos += len;
  }
  return true;
}

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_text[b]; }

int unicode_to_byte(uint32_t cp) { return cp < 512 ? byte_map().from_cp[cp] : -1; }

}  // namespace servetune::unicode
