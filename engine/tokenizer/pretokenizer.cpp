// Split-regex scanners. Positions are codepoint indices; a piece boundary (the end of the range being split)
// behaves like "no character" for every lookahead, as in llama.cpp's custom regex implementations.
#include "tokenizer/pretokenizer.h"

#include "tokenizer/unicode.h"

namespace servetune::tok {
namespace {

constexpr uint8_t kOutside = 0xF0;  // class of a position outside the range: no category, not whitespace

struct Range {
  const CodepointText& t;
  uint32_t begin, end;
  std::vector<uint32_t>& ends;

  uint32_t cp(uint32_t i) const { return i < end ? t.cps[i] : 0xFFFFFFFFu; }
  uint8_t cls(uint32_t i) const { return i < end ? t.classes[i] : kOutside; }
  void cut(uint32_t at) {
    if (ends.empty() || ends.back() < at) ends.push_back(at);
  }
};

inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }
inline bool is_other(uint8_t c) {  // [^\s\p{L}\p{N}] inside the range
  return c != kOutside && !unicode::is_whitespace(c) && !unicode::is_letter(c) && !unicode::is_number(c);
}
inline bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

// Length of a contraction ('s 't 'm 'd 're 've 'll) at pos, 0 if none.
uint32_t contraction(const Range& r, uint32_t pos, bool ignore_case) {
  if (r.cp(pos) != '\'' || pos + 1 >= r.end) return 0;
  uint32_t a = r.cp(pos + 1);
  if (ignore_case) a = ascii_lower(a);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= r.end) return 0;
  uint32_t b = r.cp(pos + 2);
  if (ignore_case) b = ascii_lower(b);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

void split_digits(Range r) {
  uint32_t pos = r.begin;
  while (pos < r.end) {
    if (unicode::is_number(r.cls(pos))) {
      r.cut(++pos);
      continue;
    }
    while (pos < r.end && !unicode::is_number(r.cls(pos))) ++pos;
    r.cut(pos);
  }
}

// Trailing whitespace handling shared by all three regexes: \s+(?!\S) then \s+.
uint32_t whitespace_run(const Range& r, uint32_t pos) {
  uint32_t n = 0;
  while (unicode::is_whitespace(r.cls(pos + n))) ++n;
  if (n > 1 && pos + n < r.end) return pos + n - 1;
  if (n > 0) return pos + n;
  return pos + 1;
}

void split_gpt2(Range r) {
  uint32_t pos = r.begin;
  while (pos < r.end) {
    if (uint32_t n = contraction(r, pos, false)) {
      pos += n;
      r.cut(pos);
      continue;
    }
    const uint32_t skip = r.cp(pos) == ' ' ? 1 : 0;
    const uint8_t c2 = r.cls(pos + skip);
    if (unicode::is_letter(c2)) {
      pos += skip;
      while (unicode::is_letter(r.cls(pos))) ++pos;
    } else if (unicode::is_number(c2)) {
      pos += skip;
      while (unicode::is_number(r.cls(pos))) ++pos;
    } else if (is_other(c2)) {
      pos += skip;
      while (is_other(r.cls(pos))) ++pos;
    } else {
      pos = whitespace_run(r, pos);
    }
    r.cut(pos);
  }
}

void split_llama3(Range r, uint32_t max_digits) {
  uint32_t pos = r.begin;
  while (pos < r.end) {
    if (uint32_t n = contraction(r, pos, true)) {
      pos += n;
      r.cut(pos);
      continue;
    }
    const uint32_t c = r.cp(pos);
    const uint8_t cls = r.cls(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!is_crlf(c) && !unicode::is_number(cls) && (unicode::is_letter(cls) || unicode::is_letter(r.cls(pos + 1)))) {
      ++pos;
      while (unicode::is_letter(r.cls(pos))) ++pos;
      r.cut(pos);
      continue;
    }
    // \p{N}{1,max_digits}
    if (unicode::is_number(cls)) {
      uint32_t run = 0;
      while (unicode::is_number(r.cls(pos))) {
        ++pos;
        if (++run == max_digits) {
          r.cut(pos);
          run = 0;
        }
      }
      r.cut(pos);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*': the optional space is taken even when nothing follows it in the range.
    const uint8_t c2 = c == ' ' ? r.cls(pos + 1) : cls;
    if (!unicode::is_whitespace(c2) && !unicode::is_letter(c2) && !unicode::is_number(c2)) {
      pos += c == ' ' ? 1 : 0;
      while (is_other(r.cls(pos))) ++pos;
      while (is_crlf(r.cp(pos))) ++pos;
      r.cut(pos);
      continue;
    }
    // \s*[\r\n]+ : up to the last CR/LF of the whitespace run
    uint32_t n = 0, last_crlf_end = 0;
    while (unicode::is_whitespace(r.cls(pos + n))) {
      if (is_crlf(r.cp(pos + n))) last_crlf_end = pos + n + 1;
      ++n;
    }
    pos = last_crlf_end > 0 ? last_crlf_end : whitespace_run(r, pos);
    r.cut(pos);
  }
}

}  // namespace

const char* pre_split_name(PreSplit s) {
  switch (s) {
    case PreSplit::kDigits: return "digits";
    case PreSplit::kGpt2: return "gpt2";
    case PreSplit::kLlama3: return "llama3";
    case PreSplit::kQwen2: return "qwen2";
  }
  return "?";
}

void decode_codepoints(std::string_view text, CodepointText& out) {
  out.cps.clear();
  out.offsets.clear();
  out.classes.clear();
  out.cps.reserve(text.size());
  out.offsets.reserve(text.size() + 1);
  out.classes.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 1;
    auto b = static_cast<uint8_t>(text[pos]);
    uint32_t cp = b < 0x80 ? b : unicode::decode_lenient(text, pos, len);
    out.cps.push_back(cp);
    out.offsets.push_back(static_cast<uint32_t>(pos));
    out.classes.push_back(unicode::cp_class(cp));
    pos += len;
  }
  out.offsets.push_back(static_cast<uint32_t>(text.size()));
}

void pre_split(const CodepointText& t, uint32_t begin, uint32_t end, std::span<const PreSplit> stages,
               std::vector<uint32_t>& ends, std::vector<uint32_t>& scratch) {
  const size_t first = ends.size();
  ends.push_back(end);  // one piece: the whole range
  for (PreSplit stage : stages) {
    scratch.assign(ends.begin() + static_cast<std::ptrdiff_t>(first), ends.end());
    ends.resize(first);
    uint32_t b = begin;
    for (uint32_t e : scratch) {
      Range r{t, b, e, ends};
      switch (stage) {
        case PreSplit::kDigits: split_digits(r); break;
        case PreSplit::kGpt2: split_gpt2(r); break;
        case PreSplit::kLlama3: split_llama3(r, 3); break;
        case PreSplit::kQwen2: split_llama3(r, 1); break;
      }
      b = e;
    }
  }
}

}  // namespace servetune::tok
