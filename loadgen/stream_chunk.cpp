// Parsing of OpenAI-compatible streaming payloads (see stream_chunk.h) with a single-pass strict JSON scanner
// that materialises only the fields a benchmark needs (choices[0] text / delta.content, usage, error) and skips
// everything else while still validating it, so a malformed payload is always reported. It runs once per
// streamed token, so it avoids building a DOM; tests check it against nlohmann::json on valid and broken input.
#include "loadgen/stream_chunk.h"

#include <bit>
#include <charconv>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace servetune::loadgen {
namespace {

// First byte in [p, end) that ends the plain part of a JSON string: '"', '\\' or a control character (< 0x20).
// Sixteen bytes at a time with SSE2, then eight (SWAR; the lowest flagged byte of each test is exact, which is all
// that is used). Inlined: most strings in a streamed chunk are short, so the call would cost more than the scan.
[[gnu::always_inline]] inline const char* plain_string_end(const char* p, const char* end) {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1f);
  while (end - p >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                     _mm_cmpeq_epi8(_mm_min_epu8(v, control), v));
    const auto mask = static_cast<unsigned>(_mm_movemask_epi8(hit));
    if (mask != 0) return p + std::countr_zero(mask);
    p += 16;
  }
#endif
  static_assert(std::endian::native == std::endian::little);
  constexpr uint64_t k01 = 0x0101010101010101ull, k80 = 0x8080808080808080ull;
  while (end - p >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    const uint64_t q = v ^ (k01 * '"'), b = v ^ (k01 * '\\');
    const uint64_t hit = (((q - k01) & ~q) | ((b - k01) & ~b) | ((v - k01 * 0x20) & ~v)) & k80;
    if (hit != 0) return p + std::countr_zero(hit) / 8;
    p += 8;
  }
  while (p != end && *p != '"' && *p != '\\' && static_cast<unsigned char>(*p) >= 0x20) ++p;
  return p;
}

class Scanner {
 public:
  explicit Scanner(std::string_view s) : begin_(s.data()), p_(s.data()), end_(s.data() + s.size()) {}

  bool ok() const { return ok_; }
  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  bool consumed() const { return ok_ && p_ == end_; }  // every byte read, no trailing whitespace skipped
  bool at_end() {
    ws();
    return p_ == end_;
  }
  void fail() {
    ok_ = false;
    p_ = end_;  // every later read sees the end, so a failed scan unwinds at once
  }

  void ws() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  // The next significant character, '\0' at the end (compact JSON, the usual case, has no whitespace to skip).
  char peek() {
    if (p_ == end_) return '\0';
    if (static_cast<unsigned char>(*p_) > ' ') return *p_;
    ws();
    return p_ != end_ ? *p_ : '\0';
  }
  bool eat(char c) {
    if (peek() != c) return false;
    ++p_;
    return true;
  }
  bool expect(char c) {
    if (!eat(c)) fail();
    return ok_;
  }

  // Iterates an object's members: calls member(key) positioned at the value; the callee consumes the value and
  // must be done with `key` before it reads nested objects (an escaped key lives in a reused buffer).
  template <class F>
  void object(F&& member) {
    if (!expect('{')) return;
    if (eat('}')) return;
    do {
      std::string_view key;
      if (!key_view(key) || !expect(':')) return fail();
      member(key);
      if (!ok_) return;
    } while (eat(','));
    expect('}');
  }

  // A member name: a view into the payload when it has no escapes (the usual case), else decoded.
  bool key_view(std::string_view& key) {
    if (peek() != '"') return false;
    const char* start = p_ + 1;
    const char* stop = plain_string_end(start, end_);
    if (stop != end_ && *stop == '"') {
      key = std::string_view(start, static_cast<size_t>(stop - start));
      p_ = stop + 1;
      return true;
    }
    key_buf_.clear();
    if (!string(&key_buf_)) return false;
    key = key_buf_;
    return true;
  }

  // Iterates an array's elements: calls element(index) positioned at the element.
  template <class F>
  void array(F&& element) {
    if (!expect('[')) return;
    if (eat(']')) return;
    size_t i = 0;
    do {
      element(i++);
      if (!ok_) return;
    } while (eat(','));
    expect(']');
  }

  // Reads a string, decoding escapes into *out when given.
  bool string(std::string* out) {
    if (!eat('"')) return fail(), false;
    for (;;) {
      const char* stop = plain_string_end(p_, end_);
      if (out != nullptr) out->append(p_, static_cast<size_t>(stop - p_));
      p_ = stop;
      if (p_ == end_) break;
      const char c = *p_++;
      if (c == '"') return true;
      if (c != '\\' || p_ == end_) break;  // a raw control character, or a lone backslash at the end
      const char e = *p_++;
      char decoded = 0;
      switch (e) {
        case '"': decoded = '"'; break;
        case '\\': decoded = '\\'; break;
        case '/': decoded = '/'; break;
        case 'b': decoded = '\b'; break;
        case 'f': decoded = '\f'; break;
        case 'n': decoded = '\n'; break;
        case 'r': decoded = '\r'; break;
        case 't': decoded = '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(cp)) return fail(), false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo = 0;
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return fail(), false;
            p_ += 2;
            if (!hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) return fail(), false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return fail(), false;
          }
          if (out != nullptr) append_utf8(*out, cp);
          continue;
        }
        default:
          return fail(), false;
      }
      if (out != nullptr) out->push_back(decoded);
    }
    return fail(), false;
  }

  // Reads a number; *as_int gets its value when it is an integer that fits, else stays unset (-1 on return).
  bool number(int64_t* as_int) {
    ws();
    const char* start = p_;
    bool integral = true;
    if (p_ != end_ && *p_ == '-') ++p_;
    if (p_ != end_ && *p_ == '0') {
      ++p_;
    } else if (!digits()) {
      return fail(), false;
    }
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      integral = false;
      if (!digits()) return fail(), false;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      integral = false;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digits()) return fail(), false;
    }
    if (as_int != nullptr) {
      *as_int = -1;
      int64_t v = 0;
      const auto r = std::from_chars(start, p_, v);
      if (integral && r.ec == std::errc()) *as_int = v;
    }
    return true;
  }

  void skip_value(int depth = 0) {
    if (depth > 256) return fail();
    switch (peek()) {
      case '{':
        return object([&](std::string_view) { skip_value(depth + 1); });
      case '[':
        return array([&](size_t) { skip_value(depth + 1); });
      case '"':
        string(nullptr);
        return;
      case 't':
        return literal("true");
      case 'f':
        return literal("false");
      case 'n':
        return literal("null");
      default:
        number(nullptr);
    }
  }

  bool null_next() {
    if (peek() != 'n') return false;
    literal("null");
    return true;
  }

  std::string_view rest_from(const char* start) const {
    return std::string_view(start, static_cast<size_t>(p_ - start));
  }
  const char* pos() {
    ws();
    return p_;
  }

 private:
  bool digits() {
    const char* start = p_;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    return p_ != start;
  }
  void literal(std::string_view word) {
    ws();
    if (static_cast<size_t>(end_ - p_) < word.size() || std::memcmp(p_, word.data(), word.size()) != 0) return fail();
    p_ += word.size();
  }
  bool hex4(uint32_t& v) {
    if (end_ - p_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = *p_++;
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return false;
      }
    }
    return true;
  }
  static void append_utf8(std::string& out, uint32_t cp) {
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

  const char* begin_;
  const char* p_;
  const char* end_;
  bool ok_ = true;
  std::string key_buf_;
};

std::string data_snippet(std::string_view s) {
  std::string out(s.substr(0, 80));
  if (s.size() > 80) out += "...";
  return out;
}

// Where the text strings read from a payload lie: [begin, end) of the last one's raw content between its quotes.
struct TextSpan {
  int count = 0;
  size_t begin = 0;
  size_t end = 0;
};

// Reads the string at the scanner (peek() saw its quote) into out.text and records where its content lies.
void read_text(Scanner& sc, StreamChunk& out, TextSpan& span) {
  const size_t open = sc.offset();
  if (!sc.string(&out.text)) return;
  ++span.count;
  span.begin = open + 1;
  span.end = sc.offset() - 1;
}

// choices[0]: completions carry "text", chat carries "delta": {"content": ...}.
void scan_choice(Scanner& sc, ApiKind kind, StreamChunk& out, TextSpan& span) {
  if (sc.peek() != '{') return sc.skip_value();
  sc.object([&](std::string_view key) {
    if (kind == ApiKind::kCompletions && key == "text" && sc.peek() == '"') {
      read_text(sc, out, span);
    } else if (kind == ApiKind::kChat && key == "delta" && sc.peek() == '{') {
      sc.object([&](std::string_view k) {
        if (k == "content" && sc.peek() == '"') {
          read_text(sc, out, span);
        } else {
          sc.skip_value();
        }
      });
    } else {
      sc.skip_value();
    }
  });
}

void scan_error(Scanner& sc, StreamChunk& out) {
  const char* start = sc.pos();
  if (sc.peek() == '"') {
    std::string msg;
    sc.string(&msg);
    out.error = "server error in stream: " + msg;
    return;
  }
  std::string message;
  if (sc.peek() == '{') {
    sc.object([&](std::string_view k) {
      if (k == "message" && sc.peek() == '"') {
        message.clear();
        sc.string(&message);
      } else {
        sc.skip_value();
      }
    });
  } else {
    sc.skip_value();
  }
  out.error = "server error in stream: " + (message.empty() ? std::string(sc.rest_from(start)) : message);
}

void scan_payload(std::string_view data, ApiKind kind, StreamChunk& out, TextSpan& span) {
  out.done = false;
  out.has_choices = false;
  out.text.clear();
  out.has_usage = false;
  out.prompt_tokens = out.completion_tokens = out.cached_tokens = -1;
  out.error.clear();
  out.server_error = false;
  if (data == "[DONE]") {
    out.done = true;
    return;
  }
  Scanner sc(data);
  if (sc.peek() != '{') {
    sc.skip_value();
    out.error = sc.ok() && sc.at_end() ? "SSE data is not a JSON object: " + data_snippet(data)
                                       : "malformed JSON in SSE data: " + data_snippet(data);
    return;
  }
  std::string error;
  sc.object([&](std::string_view key) {
    if (key == "choices" && sc.peek() == '[') {
      sc.array([&](size_t i) {
        out.has_choices = true;
        if (i == 0) {
          scan_choice(sc, kind, out, span);
        } else {
          sc.skip_value();
        }
      });
    } else if (key == "usage" && sc.peek() == '{') {
      out.has_usage = true;
      const auto is_number = [&] {
        const char c = sc.peek();
        return c != '{' && c != '[' && c != '"' && c != 't' && c != 'f' && c != 'n';
      };
      sc.object([&](std::string_view k) {
        if ((k == "prompt_tokens" || k == "completion_tokens") && is_number()) {
          sc.number(k == "prompt_tokens" ? &out.prompt_tokens : &out.completion_tokens);
        } else if (k == "prompt_tokens_details" && sc.peek() == '{') {
          // OpenAI's usage.prompt_tokens_details.cached_tokens (vLLM with --enable-prompt-tokens-details, servetune).
          sc.object([&](std::string_view d) {
            if (d == "cached_tokens" && is_number()) {
              sc.number(&out.cached_tokens);
            } else {
              sc.skip_value();
            }
          });
        } else {
          sc.skip_value();
        }
      });
    } else if (key == "error") {
      if (!sc.null_next()) {
        StreamChunk e;
        scan_error(sc, e);
        error = e.error;
      }
    } else {
      sc.skip_value();
    }
  });
  if (!sc.ok() || !sc.at_end()) {
    out = StreamChunk{};
    out.error = "malformed JSON in SSE data: " + data_snippet(data);
    return;
  }
  if (!error.empty()) {
    out.has_choices = false;
    out.error = std::move(error);
    out.server_error = true;
  }
}

}  // namespace

void parse_stream_chunk(std::string_view data, ApiKind kind, StreamChunk& out) {
  TextSpan span;
  scan_payload(data, kind, out, span);
}

void StreamChunkParser::parse(std::string_view data, ApiKind kind, StreamChunk& out) {
  const size_t suffix = last_.size() - text_end_;
  if (!last_.empty() && kind == last_kind_ && data.size() >= text_begin_ + suffix &&
      std::memcmp(data.data(), last_.data(), text_begin_) == 0 &&
      std::memcmp(data.data() + data.size() - suffix, last_.data() + text_end_, suffix) == 0) {
    // The same bytes around the text string's content as the last payload: the payload is valid, with the same
    // fields, exactly when the new content is a valid JSON string ending at the suffix's closing quote.
    out.text.clear();
    Scanner sc(data.substr(text_begin_ - 1, data.size() - suffix - text_begin_ + 2));
    if (sc.string(&out.text) && sc.consumed()) {
      out.done = false;
      out.has_choices = last_fields_.has_choices;
      out.has_usage = last_fields_.has_usage;
      out.prompt_tokens = last_fields_.prompt_tokens;
      out.completion_tokens = last_fields_.completion_tokens;
      out.cached_tokens = last_fields_.cached_tokens;
      out.error.clear();
      out.server_error = false;
      ++fast_path_hits_;
      return;
    }
  }
  TextSpan span;
  scan_payload(data, kind, out, span);
  if (!out.error.empty() || out.done || span.count != 1) {
    last_.clear();
    return;
  }
  last_.assign(data);
  last_kind_ = kind;
  text_begin_ = span.begin;
  text_end_ = span.end;
  last_fields_.has_choices = out.has_choices;
  last_fields_.has_usage = out.has_usage;
  last_fields_.prompt_tokens = out.prompt_tokens;
  last_fields_.completion_tokens = out.completion_tokens;
  last_fields_.cached_tokens = out.cached_tokens;
}

}  // namespace servetune::loadgen
