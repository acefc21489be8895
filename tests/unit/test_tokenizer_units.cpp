// Tokenizer behaviour beyond the goldens: incremental decoding at UTF-8 boundaries, errors for bad GGUF
// tokenizer metadata and bad ids, concurrent use, and the unicode helpers.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "formats/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace servetune {
namespace {

std::unique_ptr<Tokenizer> stories() {
  GgufFile f(testing::stories_path());
  return Tokenizer::from_gguf(f);
}

TEST(TokenizerIncremental, NeverSplitsUtf8AndMatchesDecode) {
  auto tok = stories();  // 512-token vocabulary: CJK and emoji come out as <0xXX> byte tokens
  const std::string text = "héllo 中文 😀 done\n";
  auto ids = tok->encode(text, true, false);
  IncrementalDecoder dec(*tok);
  std::string joined;
  size_t held_back = 0;
  for (int32_t id : ids) {
    std::string part = dec.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(part)) << "push(" << id << ") emitted a broken sequence";
    if (part.empty() && !tok->is_control(id)) ++held_back;
    joined += part;
  }
  joined += dec.flush();
  EXPECT_GT(held_back, 2u);  // the byte tokens of 中, 文 and 😀 were held until complete
  EXPECT_EQ(joined, tok->decode(ids, true));
  EXPECT_EQ(joined, " " + text);  // the SPM space prefix stays: a stream continues a prompt
}

TEST(TokenizerIncremental, IllFormedBytesBecomeReplacementChars) {
  auto tok = stories();
  const int32_t b_e4 = tok->find_token("<0xE4>"), b_ff = tok->find_token("<0xFF>"), b_41 = tok->find_token("<0x41>");
  ASSERT_GE(b_e4, 0);
  IncrementalDecoder dec(*tok);
  EXPECT_EQ(dec.push(b_e4), "");                // lead byte of a 3-byte sequence: held
  EXPECT_EQ(dec.push(b_41), "\xEF\xBF\xBD" "A");  // interrupted: U+FFFD, then the ASCII byte
  EXPECT_EQ(dec.push(b_ff), "\xEF\xBF\xBD");      // never valid in UTF-8
  EXPECT_EQ(dec.push(b_e4), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");         // unfinished at the end
  EXPECT_EQ(dec.flush(), "");
  EXPECT_THROW(dec.push(tok->vocab_size()), Error);
}

TEST(TokenizerErrors, DecodeRejectsOutOfRangeIds) {
  auto tok = stories();
  for (int32_t bad : {-1, 512, 1 << 30}) {
    std::vector<int32_t> ids = {1, bad};
    try {
      tok->decode(ids);
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
    EXPECT_THROW(tok->token_to_piece(bad), Error);
  }
}

// Minimal GGUF v3 writer for tokenizer metadata (no tensors).
class MetaWriter {
 public:
  void str(const std::string& k, const std::string& v) { key(k, 8), put_str(v); }
  void boolean(const std::string& k, bool v) { key(k, 7), put<uint8_t>(v); }
  void strings(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9), put<uint32_t>(8), put<uint64_t>(v.size());
    for (const auto& s : v) put_str(s);
  }
  void floats(const std::string& k, const std::vector<float>& v) {
    key(k, 9), put<uint32_t>(6), put<uint64_t>(v.size());
    for (float f : v) put(f);
  }
  void ints(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9), put<uint32_t>(5), put<uint64_t>(v.size());
    for (int32_t i : v) put(i);
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    for (uint64_t v : {uint64_t{0}, n_}) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
    out.insert(out.end(), kv_.begin(), kv_.end());
    return out;
  }

 private:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    kv_.insert(kv_.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put<uint64_t>(s.size());
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void key(const std::string& k, uint32_t type) { put_str(k), put(type), ++n_; }
  std::vector<uint8_t> kv_;
  uint64_t n_ = 0;
};

void expect_load_error(const MetaWriter& w, ErrorKind kind, const std::string& needle) {
  auto bytes = w.bytes();
  GgufFile f(bytes, "synthetic.gguf");
  try {
    Tokenizer::from_gguf(f);
    ADD_FAILURE() << "no error (expected one mentioning '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("synthetic.gguf"), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, BadGgufMetadata) {
  const std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "a", "b", "ab"};
  {
    MetaWriter w;
    w.strings("tokenizer.ggml.tokens", toks);
    expect_load_error(w, ErrorKind::kFormat, "tokenizer.ggml.model");
  }
  {
    MetaWriter w;
    w.str("tokenizer.ggml.model", "bert");
    w.strings("tokenizer.ggml.tokens", toks);
    expect_load_error(w, ErrorKind::kUnsupported, "'bert'");
  }
  {
    MetaWriter w;
    w.str("tokenizer.ggml.model", "gpt2");
    w.str("tokenizer.ggml.pre", "made-up-pre");
    w.strings("tokenizer.ggml.tokens", toks);
    expect_load_error(w, ErrorKind::kUnsupported, "'made-up-pre'");
  }
  {
    MetaWriter w;
    w.str("tokenizer.ggml.model", "llama");
    expect_load_error(w, ErrorKind::kFormat, "tokenizer.ggml.tokens");
  }
  {
    MetaWriter w;
    w.str("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", toks);
    w.floats("tokenizer.ggml.scores", {0, 0, 0});
    expect_load_error(w, ErrorKind::kFormat, "scores has 3 entries for 6 tokens");
  }
  {
    MetaWriter w;
    w.str("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", toks);
    w.ints("tokenizer.ggml.token_type", {1, 1});
    expect_load_error(w, ErrorKind::kFormat, "token_type has 2 entries");
  }
  {
    MetaWriter w;
    w.str("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", toks);
    w.floats("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 1});
    expect_load_error(w, ErrorKind::kFormat, "token_type");
  }
  {
    MetaWriter w;
    w.str("tokenizer.ggml.model", "gpt2");
    w.strings("tokenizer.ggml.tokens", toks);
    expect_load_error(w, ErrorKind::kFormat, "tokenizer.ggml.merges");
  }
  {
    MetaWriter w;
    w.str("tokenizer.ggml.model", "llama");
    w.strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "a", "a"});
    expect_load_error(w, ErrorKind::kFormat, "duplicate");
  }
}

TEST(TokenizerSynthetic, SpmScoresDecideMerges) {
  MetaWriter w;
  w.str("tokenizer.ggml.model", "llama");
  w.strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c", "ab", "bc", "\xE2\x96\x81" "a"});
  w.floats("tokenizer.ggml.scores", {0, 0, 0, -1, -1, -1, -1, -2, -1.5f, -5});
  w.ints("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 1, 1});
  auto bytes = w.bytes();
  GgufFile f(bytes, "synthetic.gguf");
  auto tok = Tokenizer::from_gguf(f);
  // "▁abc": "bc" (-1.5) beats "ab" (-2), then "▁a" (-5) is the only pair left that is a token.
  EXPECT_EQ(tok->encode("abc", true), (std::vector<int32_t>{1, 9, 8}));
  // "▁abd": "ab" first, "▁ab" is no token; no <0xXX> tokens, so "d" falls back to <unk>.
  EXPECT_EQ(tok->encode("abd", false), (std::vector<int32_t>{3, 7, 0}));
  EXPECT_EQ(tok->decode(tok->encode("abc", false)), "abc");
}

TEST(TokenizerThreads, ConcurrentEncodeIsConsistent) {
  auto tok = stories();
  const std::string text = "Once upon a time, there was a little girl named Lily. 123 中文";
  const auto expect = tok->encode(text);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) bad[static_cast<size_t>(t)] += tok->encode(text) != expect;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

TEST(TokenizerUnicode, Classes) {
  using namespace unicode;
  EXPECT_TRUE(is_letter(cp_class('a')));
  EXPECT_TRUE(is_letter(cp_class(0x4E2D)));   // 中
  EXPECT_TRUE(is_number(cp_class(0x0663)));   // ٣
  EXPECT_TRUE(is_number(cp_class(0x2167)));   // Ⅷ (Nl)
  EXPECT_TRUE(is_whitespace(cp_class(0x3000)));
  EXPECT_TRUE(is_whitespace(cp_class(0x85)));
  EXPECT_FALSE(is_whitespace(cp_class(0x200B)));  // zero width space is Cf, not White_Space
  EXPECT_EQ(cp_class(0x0301) & 7, kMark);
  EXPECT_EQ(cp_class(0x10FFFF) & 7, kUndefined);
  EXPECT_TRUE(is_letter(cp_class(0x2EBF0)));  // CJK Extension I: Unicode 15.1
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");  // Ġ
  EXPECT_EQ(unicode_to_byte(0x120), ' ');
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9"));
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));
  EXPECT_FALSE(is_canonical_utf8("a\xFF"));
  EXPECT_EQ(canonicalize_utf8("a\xFF" "b\xC0\x80"), std::string("a\xEF\xBF\xBD" "b") + std::string(1, '\0'));
}

}  // namespace
}  // namespace servetune
