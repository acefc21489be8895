// GGUF tokenizers against llama.cpp goldens (tests/data/tokenizer/gguf_*.json, scripts/gen_tokenizer_goldens.py):
// adversarial texts (full ids), ShareGPT prompts (count + FNV-1a of ids), decode, vocabulary facts.
#include <gtest/gtest.h>

#include "formats/gguf.h"
#include "test_paths.h"
#include "unit/test_tokenizer_util.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

using nlohmann::json;
using testing::case_text;
using testing::escaped;
using testing::ids_str;

struct GgufGolden {
  json golden;
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

GgufGolden load(const std::string& name, const std::string& model_path) {
  GgufGolden g;
  g.golden = testing::read_json_file(testing::data_path("tokenizer/gguf_" + name + ".json"));
  g.file = std::make_unique<GgufFile>(model_path);
  g.tok = Tokenizer::from_gguf(*g.file);
  return g;
}

void check_vocab(const GgufGolden& g) {
  const json& v = g.golden["vocab"];
  EXPECT_EQ(g.tok->vocab_size(), v["n_vocab"].get<int32_t>());
  EXPECT_EQ(g.tok->bos_id(), v["bos"].get<int32_t>());
  EXPECT_EQ(g.tok->eos_id(), v["eos"].get<int32_t>());
  EXPECT_EQ(g.tok->add_bos(), v["add_bos"].get<bool>());
  EXPECT_EQ(g.tok->add_eos(), v["add_eos"].get<bool>());
  EXPECT_EQ(g.tok->eog_ids(), v["eog"].get<std::vector<int32_t>>());
  std::string pieces;
  for (int32_t id = 0; id < g.tok->vocab_size(); ++id) {
    std::string p = g.tok->token_to_piece(id);
    auto n = static_cast<uint32_t>(p.size());
    for (int k = 0; k < 4; ++k) pieces.push_back(static_cast<char>((n >> (8 * k)) & 0xFF));
    pieces += p;
  }
  EXPECT_EQ(testing::fnv1a64_hex(pieces), v["pieces_fnv"].get<std::string>()) << "token_to_piece differs for some id";
}

void check_cases(const GgufGolden& g) {
  int n = 0, bad = 0;
  for (const json& c : g.golden["cases"]) {
    const std::string text = case_text(c);
    const bool add = c["add_special"], parse = c["parse_special"];
    auto ids = g.tok->encode(text, add, parse);
    auto expect = c["ids"].get<std::vector<int32_t>>();
    ++n;
    if (ids != expect) {
      ++bad;
      ADD_FAILURE() << "text \"" << escaped(text) << "\" add_special=" << add << " parse_special=" << parse
                    << "\n  ours     " << ids_str(ids) << "\n  llama.cpp " << ids_str(expect);
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << n << " cases differ";
  EXPECT_GT(n, 300);
}

void check_decode(const GgufGolden& g) {
  int bad = 0;
  for (const json& c : g.golden["decode"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    const bool skip = c["skip_special"];
    std::string expect = testing::from_hex(c["hex"].get<std::string>());
    std::string got = g.tok->decode(ids, skip);
    if (got != expect) {
      ++bad;
      ADD_FAILURE() << "decode " << ids_str(ids) << " skip_special=" << skip << "\n  ours     \"" << escaped(got)
                    << "\"\n  llama.cpp \"" << escaped(expect) << "\"";
    }
  }
  EXPECT_EQ(bad, 0);
}

void check_sharegpt(const GgufGolden& g) {
  SERVETUNE_REQUIRE_FILE(testing::sharegpt_path());
  const json& rows = g.golden["sharegpt"];
  const json& modes = g.golden["sharegpt_modes"];
  auto prompts = testing::sharegpt_prompts(testing::sharegpt_path(), rows.size());
  ASSERT_EQ(prompts.size(), rows.size());
  int bad = 0;
  size_t total_tokens = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    ASSERT_EQ(prompts[i].first, row[0].get<int64_t>()) << "ShareGPT selection differs at prompt " << i;
    for (size_t m = 0; m < modes.size(); ++m) {
      auto ids = g.tok->encode(prompts[i].second, modes[m]["add_special"], modes[m]["parse_special"]);
      const auto expect_n = row[1 + 2 * m].get<size_t>();
      total_tokens += ids.size();
      if (ids.size() != expect_n || testing::fnv1a64_hex(ids) != row[2 + 2 * m].get<std::string>()) {
        if (++bad <= 5) {
          ADD_FAILURE() << "ShareGPT prompt " << i << " (conversation " << prompts[i].first << ") mode " << m
                        << ": \"" << escaped(prompts[i].second, 200) << "\"\n  ours (" << ids.size() << ") "
                        << ids_str(ids, 400) << "\n  llama.cpp has " << expect_n << " tokens";
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << rows.size() * modes.size() << " ShareGPT encodings differ";
  EXPECT_GT(total_tokens, rows.size() * 10);
}

TEST(TokenizerStories, VocabMatchesLlamaCpp) { check_vocab(load("stories260K", testing::stories_path())); }
TEST(TokenizerStories, EncodeMatchesLlamaCpp) { check_cases(load("stories260K", testing::stories_path())); }
TEST(TokenizerStories, DecodeMatchesLlamaCpp) { check_decode(load("stories260K", testing::stories_path())); }
TEST(TokenizerStories, ShareGptMatchesLlamaCpp) { check_sharegpt(load("stories260K", testing::stories_path())); }

TEST(TokenizerSmolLM2, VocabMatchesLlamaCpp) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  check_vocab(load("smollm2", testing::smollm2_path()));
}
TEST(TokenizerSmolLM2, EncodeMatchesLlamaCpp) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  check_cases(load("smollm2", testing::smollm2_path()));
}
TEST(TokenizerSmolLM2, DecodeMatchesLlamaCpp) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  check_decode(load("smollm2", testing::smollm2_path()));
}
TEST(TokenizerSmolLM2, ShareGptMatchesLlamaCpp) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  check_sharegpt(load("smollm2", testing::smollm2_path()));
}

TEST(TokenizerStories, HelloWorld) {
  GgufFile f(testing::stories_path());
  auto tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<int32_t>{1, 346, 306, 414, 263, 304, 341}));
  EXPECT_EQ(tok->model_type(), "llama");
  EXPECT_TRUE(tok->chat_template().empty());
}

TEST(TokenizerSmolLM2, SpecialTokensAndTemplate) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  GgufFile f(testing::smollm2_path());
  auto tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok->model_type(), "gpt2");
  EXPECT_TRUE(tok->is_eog(tok->find_token("<|im_end|>")));
  EXPECT_TRUE(tok->is_eog(tok->find_token("<|endoftext|>")));
  EXPECT_FALSE(tok->is_eog(tok->find_token("<|im_start|>")));
  auto ids = tok->encode("<|im_start|>user", false, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), tok->find_token("<|im_start|>"));
  EXPECT_NE(tok->encode("<|im_start|>user", false, false).front(), tok->find_token("<|im_start|>"));
  EXPECT_NE(tok->chat_template().find("<|im_start|>"), std::string::npos);
}

}  // namespace
}  // namespace servetune
