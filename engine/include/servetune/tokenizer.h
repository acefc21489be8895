// Text <-> token ids for the models servetune runs: SentencePiece-style BPE with byte fallback (GGUF
// tokenizer.ggml.model "llama"), GPT-2 byte-level BPE with the pre-tokenizer the GGUF names ("gpt2"), and
// HF tokenizer.json BPE. Ids match llama.cpp's llama_tokenize / llama_detokenize for GGUF models and HF
// `tokenizers` for tokenizer.json. A Tokenizer is immutable after loading; every method is thread-safe. Public API.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace servetune {

class GgufFile;
namespace tok {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // The tokenizer of the model at `path`: a directory is read as an HF model directory (from_hf_dir), anything else
  // as a GGUF file (from_gguf). Throws Error(kUsage) naming `path` when it does not exist.
  static std::unique_ptr<Tokenizer> from_path(const std::string& path);
  // Reads tokenizer.ggml.* from a GGUF. Throws Error(kFormat) for missing/mismatched arrays and
  // Error(kUnsupported) for a tokenizer model or pre-tokenizer it does not implement; messages name the file.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
  // Reads `dir`/tokenizer.json (BPE model) and, when present, tokenizer_config.json (bos/eos tokens,
  // add_bos_token, chat_template) and generation_config.json (extra eos ids).
  static std::unique_ptr<Tokenizer> from_hf_dir(const std::string& dir);

  explicit Tokenizer(std::unique_ptr<tok::TokenizerImpl> impl);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: prepend BOS / append EOS as the model's metadata says (add_bos(), add_eos()).
  // parse_special: text spelling a control token (e.g. "<|im_start|>") becomes that token; user-defined
  // tokens are always matched, as in llama.cpp. Malformed UTF-8 is handled as llama.cpp does: byte-level
  // BPE sees U+FFFD for each malformed byte, SentencePiece vocabularies fall back to byte tokens.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true, bool parse_special = false) const;

  // llama_detokenize(ids, remove_special = skip_special, unparse_special = !skip_special): control tokens
  // render as their text unless skip_special, which also drops a leading BOS / trailing EOS the model adds.
  // Throws Error(kUsage) for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The bytes this token contributes to decoded text (control tokens: their text). Throws Error(kUsage)
  // for an id out of range.
  std::string token_to_piece(int32_t id) const;
  // The vocabulary entry as stored (e.g. "▁Hello", "ĠHello", "<0x0A>"); id must be in range.
  const std::string& token_text(int32_t id) const;
  // Id of a vocabulary entry spelled exactly `text`, or -1.
  int32_t find_token(std::string_view text) const;
  bool is_control(int32_t id) const;  // control / unknown tokens (not rendered when skipping specials)

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;
  bool is_eog(int32_t id) const;
  // End-of-generation ids: eos plus end-of-turn tokens found by text (<|im_end|>, <|eot_id|>, ...), sorted.
  const std::vector<int32_t>& eog_ids() const;
  bool add_bos() const;
  bool add_eos() const;
  // "llama" (SentencePiece-style), "gpt2" (byte-level BPE) or "hf-bpe" (tokenizer.json).
  const std::string& model_type() const;
  const std::string& chat_template() const;  // template text, "" if the model has none
  const std::string& source() const;         // the file or directory it was loaded from

  const tok::TokenizerImpl& impl() const { return *impl_; }

 private:
  std::unique_ptr<tok::TokenizerImpl> impl_;
};

// Streams decoded text token by token without ever emitting part of a UTF-8 sequence: bytes of an
// incomplete sequence are held back until it completes; ill-formed bytes come out as U+FFFD (one per
// maximal ill-formed subpart), so every returned string is valid UTF-8. Pieces are concatenated as in
// Tokenizer::decode(ids, skip_special) except that no leading space is removed (the stream continues a
// prompt). For valid output, the concatenation of push()es and flush() equals that decode.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);
  // Emits what is held back (an unfinished sequence becomes U+FFFD) and resets.
  std::string flush();

 private:
  std::string take_complete(bool at_end);
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

struct ChatMessage {
  std::string role;
  std::string content;
};

// Renders messages the way the model's Jinja chat template would, for the template families recognised
// from its text (no Jinja engine): ChatML (with a default system prompt when the template injects one, as
// SmolLM2's does), Llama-2 ([INST] / <<SYS>>), Llama-3 (<|start_header_id|>). Special tokens appear as text
// (tokenize the result with parse_special = true; it starts with the BOS text when the template adds it).
// Throws Error(kUnsupported) naming the problem for an unrecognised or missing template, and
// Error(kUsage) for messages the template rejects (e.g. Llama-2 roles that do not alternate).
std::string apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);
// Same with explicit template text; bos/eos are the texts the template's bos_token / eos_token stand for.
std::string apply_chat_template(std::string_view template_text, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::string_view bos_text = "",
                                std::string_view eos_text = "");
// The family name a template text is recognised as ("chatml", "llama2", "llama3"), or "" if none.
std::string detect_chat_template(std::string_view template_text);

}  // namespace servetune
