// Unicode helpers for the tokenizers: lenient UTF-8 decoding (llama.cpp-compatible), codepoint classes
// (general category + White_Space, Unicode 15.1) and the GPT-2 byte <-> printable-codepoint map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace servetune::unicode {

// Low 3 bits of a class byte: the general-category family; bit 3: White_Space.
enum CpClass : uint8_t {
  kUndefined = 0,  // Cn
  kNumber = 1,     // N*
  kLetter = 2,     // L*
  kSeparator = 3,  // Z*
  kMark = 4,       // M*
  kPunct = 5,      // P*
  kSymbol = 6,     // S*
  kControl = 7,    // Cc Cf Co Cs
};
inline constexpr uint8_t kWhitespaceBit = 0x08;
inline constexpr uint32_t kReplacementChar = 0xFFFD;
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

extern const uint32_t kRangeTable[];
extern const size_t kRangeTableSize;

// Class byte of a codepoint (> kMaxCodepoint: kUndefined without the whitespace bit).
uint8_t cp_class(uint32_t cp);
inline bool is_letter(uint8_t c) { return (c & 7) == kLetter; }
inline bool is_number(uint8_t c) { return (c & 7) == kNumber; }
inline bool is_whitespace(uint8_t c) { return (c & kWhitespaceBit) != 0; }

// Length of a UTF-8 sequence from its lead byte's high nibble (1 for continuation bytes), as SentencePiece
// tokenizers split text into symbols.
inline size_t utf8_len_from_lead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Decodes one codepoint at `text[pos]`, lenient like llama.cpp: overlong forms and surrogates decode to their
// value; a malformed sequence (bad lead, missing continuation, value above U+10FFFF) yields U+FFFD and
// consumes one byte. Sets `len` to the bytes consumed. Requires pos < text.size().
uint32_t decode_lenient(std::string_view text, size_t pos, size_t& len);

// Appends the UTF-8 encoding of cp (<= kMaxCodepoint; surrogates encode as 3 bytes).
void append_utf8(std::string& out, uint32_t cp);
inline std::string to_utf8(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

// True when decoding leniently and re-encoding gives back the same bytes (no malformed or overlong
// sequences), i.e. the text is already in the form the byte-level pre-tokenizer works on.
bool is_canonical_utf8(std::string_view text);
// Re-encodes every leniently decoded codepoint (malformed bytes become U+FFFD).
std::string canonicalize_utf8(std::string_view text);
// Strict UTF-8 (Unicode Table 3-7): classifies the sequence at `text[pos]`. kOk: a well-formed sequence of
// `len` bytes; kInvalid: `len` (>= 1) bytes form a maximal ill-formed subpart (one U+FFFD when replacing);
// kIncomplete: the `len` bytes up to the end are a valid but unfinished prefix. Requires pos < text.size().
enum class Utf8Step { kOk, kInvalid, kIncomplete };
Utf8Step utf8_step(std::string_view text, size_t pos, size_t& len);
bool is_valid_utf8(std::string_view text);

// GPT-2 byte-level map: each byte to a printable codepoint's UTF-8 text, and back (-1 when not in the map).
const std::string& byte_to_unicode(uint8_t b);
int unicode_to_byte(uint32_t cp);

}  // namespace servetune::unicode
