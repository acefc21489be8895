// libFuzzer target: encode arbitrary bytes with the stories260K vocabulary (SentencePiece-style with byte
// fallback), then decode. Checks ids are in range, streamed text is valid UTF-8, and valid UTF-8 text without
// "▁" round-trips exactly (a malformed byte before a space swallows the escaped "▁" into byte tokens, as in
// llama.cpp). Run from the repository root (scripts/fuzz.sh does).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

const servetune::Tokenizer& tokenizer() {
  static const servetune::GgufFile file("tests/data/stories260K.gguf");
  static const std::unique_ptr<servetune::Tokenizer> tok = servetune::Tokenizer::from_gguf(file);
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const servetune::Tokenizer& tok = tokenizer();
  const bool add_special = data[0] & 1, parse_special = data[0] & 2;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  servetune::IncrementalDecoder stream(tok, false);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
    if (!servetune::unicode::is_valid_utf8(stream.push(id))) std::abort();
  }
  if (!servetune::unicode::is_valid_utf8(stream.flush())) std::abort();
  const std::string decoded = tok.decode(ids, true);
  if (!add_special && !parse_special && servetune::unicode::is_valid_utf8(text) &&
      text.find("\xE2\x96\x81") == std::string::npos && decoded != text) {
    std::abort();
  }
  return 0;
}
