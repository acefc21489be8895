// Internal state shared by the loaders (gguf_loader.cpp, hf_loader.cpp) and the encode/decode code.
// Invariants after finalize(): texts/scores/attrs have vocab_size entries; text_to_id holds every text;
// byte-level BPE symbols with ids >= vocab_size are texts that merges produce but the vocabulary lacks.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/hash_tables.h"
#include "tokenizer/pretokenizer.h"

namespace servetune::tok {

// Token attributes (llama.cpp's llama_token_attr bits).
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
};
// GGUF tokenizer.ggml.token_type values.
uint32_t attr_from_token_type(int64_t type);

enum class ModelKind {
  kSpm,  // score-driven merges over UTF-8 characters, "▁" for spaces, <0xXX> byte fallback (llama.cpp SPM)
  kBpe,  // rank-driven merges over symbols of each pre-tokenized word
};

// How a BPE word becomes its initial symbols.
enum class SymbolMode {
  kByteLevel,  // each byte -> the token of its GPT-2 printable codepoint
  kChars,      // each UTF-8 character -> its token, else <0xXX> byte tokens (byte_fallback), else unk
};

struct BpeSymbol {
  int32_t id;
  int32_t prev, next;  // -1 at the ends
  uint32_t begin, len;  // SPM: byte range in the text
};
struct MergeCandidate {
  int32_t rank;  // BPE: merge rank (lower first); SPM: unused
  float score;   // SPM: token score (higher first)
  int32_t left, right;
  int32_t left_id, right_id;  // BPE: ids when queued; SPM: left_id holds the merged byte length
};

// Buffers reused across the fragments and words of one encode call.
struct Scratch {
  std::string text;
  CodepointText cps;
  std::vector<uint32_t> ends, split_tmp;
  std::vector<BpeSymbol> syms;
  std::vector<MergeCandidate> heap;
};

struct TokenizerImpl {
  std::string source;      // file or directory, for messages
  std::string model_type;  // "llama", "gpt2", "hf-bpe"
  ModelKind kind = ModelKind::kSpm;

  std::vector<std::string> texts;
  std::vector<float> scores;
  std::vector<uint32_t> attrs;
  StringIdMap text_to_id;
  size_t max_token_len = 0;

  int32_t bos = -1, eos = -1, unk = -1, eot = -1, eom = -1;
  std::vector<int32_t> eog;
  std::vector<int32_t> extra_eog;  // end-of-generation ids named by the model's config (added by finalize)
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = false;  // SPM: a space before the first text fragment; decode strips it back
  bool strip_joined_space = false;  // HF decoders (Strip / Metaspace): drop one leading space of the joined text
  bool clean_spaces = false;      // llama.cpp's clean-up of " ," " ." " 's" ... on decode
  std::string chat_template;

  // BPE
  SymbolMode symbol_mode = SymbolMode::kByteLevel;
  std::vector<PreSplit> pre_splits;
  bool ignore_merges = false;  // a word that is itself a token is emitted whole (Llama-3)
  bool byte_fallback = false;  // kChars: unknown characters become <0xXX> tokens
  bool fuse_unk = false;
  // kChars normalisation/pre-tokenisation (HF Metaspace / Prepend+Replace): spaces become `space_text`,
  // and `prefix_text` is prepended to the first (or every) fragment.
  std::string space_text;
  std::string prefix_text;
  bool prefix_every_fragment = false;
  bool prefix_skip_if_present = false;  // Metaspace: no prefix when the fragment already starts with it
  bool split_on_space_text = false;     // Metaspace split=true: words start at each space_text
  bool byte_level_add_prefix_space = false;
  MergeTable merges;
  std::array<int32_t, 256> byte_symbol{};  // kByteLevel initial symbol of each byte
  std::array<int32_t, 256> byte_token{};   // <0xXX> token of each byte, -1 if absent
  std::vector<std::vector<int32_t>> extra_symbol_output;  // ids emitted for symbol vocab_size + i

  // Tokens split out of the text before tokenization (control/user-defined/unknown), longest first.
  std::vector<int32_t> special_order;
  std::vector<std::string> pieces;  // token_to_piece with special tokens rendered

  int32_t vocab_size() const { return static_cast<int32_t>(texts.size()); }
  int32_t find(std::string_view text) const { return text_to_id.find(text); }

  // Builds text_to_id from texts (first id wins for duplicate texts).
  void index_texts();
  // Computes byte tables, special token order, EOG ids and decode pieces; call once texts/attrs/ids are set.
  void finalize();

  // Tokenize one fragment of text without special tokens. SPM: `after_special` (a special token or the
  // start of the input precedes it) triggers the space prefix. BPE: `first_fragment` (it starts the input)
  // decides a "first"-scheme Metaspace prefix.
  void encode_spm(std::string_view text, bool after_special, Scratch& scratch, std::vector<int32_t>& out) const;
  void encode_bpe(std::string_view text, bool first_fragment, Scratch& scratch, std::vector<int32_t>& out) const;
  // Runs the merges over scratch.syms (initial symbols) and appends the resulting ids.
  void bpe_merge(Scratch& scratch, std::vector<int32_t>& out) const;
  void emit_symbol(int32_t symbol, std::vector<int32_t>& out) const;
};

// Builds `t.merges` from merge rules in rank order. Texts missing from the vocabulary get extra symbol ids
// (llama.cpp keeps such merges; they fall back to single-byte tokens on output) unless `strict`, where they
// throw Error(kFormat) (HF tokenizers rejects them). Also fills byte_symbol for byte-level vocabularies.
void build_merges(TokenizerImpl& t, const std::vector<std::pair<std::string, std::string>>& rules, bool strict);

}  // namespace servetune::tok
