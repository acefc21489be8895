// Pre-tokenizers for byte-level BPE: hand-written scanners equivalent to the GPT-2, Llama-3 and Qwen2 split
// regexes (llama.cpp's semantics, including its handling of piece boundaries) and the "\p{N}" digit splitter.
// They work on a decoded codepoint array and cut a range into contiguous pieces (no allocation per piece).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace servetune::tok {

enum class PreSplit : uint8_t {
  kDigits,  // \p{N}: every number codepoint becomes its own piece (SmolLM/StarCoder)
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,   // as kLlama3 with \p{N} instead of \p{N}{1,3}
};
const char* pre_split_name(PreSplit s);

// Codepoints of a text with their byte offsets (offsets has one extra entry: the text size) and classes.
struct CodepointText {
  std::vector<uint32_t> cps;
  std::vector<uint32_t> offsets;
  std::vector<uint8_t> classes;
  size_t size() const { return cps.size(); }
};
// Decodes `text` (which must be canonical UTF-8, see unicode::is_canonical_utf8) into `out`.
void decode_codepoints(std::string_view text, CodepointText& out);

// Cuts [begin, end) of `t` with each stage in turn (a later stage re-splits every piece of the earlier one)
// and appends the end index of every final piece to `ends`. `scratch` is reused between calls.
void pre_split(const CodepointText& t, uint32_t begin, uint32_t end, std::span<const PreSplit> stages,
               std::vector<uint32_t>& ends, std::vector<uint32_t>& scratch);

}  // namespace servetune::tok
