// HF tokenizer.json loading against HF `tokenizers` goldens (tests/data/tokenizer/hf_*.json): small committed
// tokenizers of five styles (Llama-2 Prepend+Replace with byte fallback, Metaspace, Llama-3 Split+ByteLevel,
// Qwen2, GPT-2) and SmolLM2's vocabulary rebuilt as tokenizer.json from its GGUF.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/test_tokenizer_util.h"

namespace servetune {
namespace {

using nlohmann::json;
using testing::escaped;
using testing::ids_str;

void check_golden(const Tokenizer& tok, const json& golden, bool sharegpt_required) {
  int bad = 0;
  for (const json& c : golden["cases"]) {
    const std::string text = c["text"];
    auto ids = tok.encode(text, c["add_special"], c["parse_special"]);
    auto expect = c["ids"].get<std::vector<int32_t>>();
    if (ids != expect && ++bad <= 10) {
      ADD_FAILURE() << "text \"" << escaped(text) << "\" add_special=" << c["add_special"] << "\n  ours       "
                    << ids_str(ids) << "\n  tokenizers " << ids_str(expect);
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << golden["cases"].size() << " cases differ";
  bad = 0;
  for (const json& c : golden["decode"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    std::string got = tok.decode(ids, c["skip_special"]);
    if (got != c["text"].get<std::string>() && ++bad <= 10) {
      ADD_FAILURE() << "decode " << ids_str(ids) << " skip_special=" << c["skip_special"] << "\n  ours       \""
                    << escaped(got) << "\"\n  tokenizers \"" << escaped(c["text"]) << "\"";
    }
  }
  EXPECT_EQ(bad, 0) << bad << " decodes differ";
  if (!std::filesystem::exists(testing::sharegpt_path())) {
    if (sharegpt_required) SERVETUNE_REQUIRE_FILE(testing::sharegpt_path());
    return;
  }
  const json& rows = golden["sharegpt"];
  auto prompts = testing::sharegpt_prompts(testing::sharegpt_path(), rows.size());
  ASSERT_EQ(prompts.size(), rows.size());
  bad = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    auto ids = tok.encode(prompts[i].second, true, true);
    if ((ids.size() != rows[i][1].get<size_t>() || testing::fnv1a64_hex(ids) != rows[i][2].get<std::string>()) && ++bad <= 5) {
      ADD_FAILURE() << "ShareGPT prompt " << i << ": \"" << escaped(prompts[i].second, 200) << "\"\n  ours ("
                    << ids.size() << ") " << ids_str(ids, 400) << "\n  tokenizers has " << rows[i][1] << " tokens";
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << rows.size() << " ShareGPT prompts differ";
}

class HfStyle : public ::testing::TestWithParam<std::string> {};

TEST_P(HfStyle, MatchesHfTokenizers) {
  auto tok = Tokenizer::from_hf_dir(testing::data_path("tokenizer/hf/" + GetParam()));
  EXPECT_EQ(tok->model_type(), "hf-bpe");
  check_golden(*tok, testing::read_json_file(testing::data_path("tokenizer/hf_" + GetParam() + ".json")), true);
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, HfStyle, ::testing::Values("llama2", "metaspace", "llama3", "qwen2", "gpt2"));

TEST(TokenizerHf, ConfigFlags) {
  auto llama3 = Tokenizer::from_hf_dir(testing::data_path("tokenizer/hf/llama3"));
  EXPECT_TRUE(llama3->add_bos());
  EXPECT_EQ(llama3->token_text(llama3->bos_id()), "<|begin_of_text|>");
  EXPECT_EQ(llama3->token_text(llama3->eos_id()), "<|eot_id|>");
  EXPECT_TRUE(llama3->is_eog(llama3->find_token("<|eot_id|>")));
  EXPECT_TRUE(llama3->is_eog(llama3->find_token("<|end_of_text|>")));
  EXPECT_NE(llama3->chat_template().find("<|start_header_id|>"), std::string::npos);
  auto qwen = Tokenizer::from_hf_dir(testing::data_path("tokenizer/hf/qwen2"));
  EXPECT_FALSE(qwen->add_bos());
  EXPECT_EQ(qwen->bos_id(), -1);
  EXPECT_TRUE(qwen->is_eog(qwen->find_token("<|im_end|>")));
  // A non-special added token is split out even without parse_special; a special one is not.
  auto ids = qwen->encode("x<user_tag>y<|im_start|>", false, false);
  EXPECT_NE(std::find(ids.begin(), ids.end(), qwen->find_token("<user_tag>")), ids.end());
  EXPECT_EQ(std::find(ids.begin(), ids.end(), qwen->find_token("<|im_start|>")), ids.end());
}

// Writes SmolLM2's GGUF vocabulary as a tokenizer.json, with the recipe of smollm2_tokenizer_json() in
// scripts/gen_tokenizer_goldens.py (Digits + ByteLevel pre-tokenizer, control tokens as special added tokens).
std::string write_smollm2_tokenizer_json(const std::string& dir) {
  GgufFile f(testing::smollm2_path());
  const auto& tokens = f.find("tokenizer.ggml.tokens")->strings();
  const GgufValue& types = *f.find("tokenizer.ggml.token_type");
  json vocab = json::object(), added = json::array(), merges = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab[std::string(tokens[i])] = i;
    if (types.at(i).as_int() == 3) {
      added.push_back({{"id", i}, {"content", std::string(tokens[i])}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    }
  }
  for (std::string_view m : f.find("tokenizer.ggml.merges")->strings()) merges.push_back(std::string(m));
  json j = {{"version", "1.0"}, {"added_tokens", added}, {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", json::array({
                {{"type", "Digits"}, {"individual_digits", true}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}})}}},
            {"post_processor", nullptr}, {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false},
                       {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}}};
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  return dir;
}

TEST(TokenizerHf, SmolLM2RebuiltMatchesHfTokenizers) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  const std::string dir = ::testing::TempDir() + "servetune_hf_smollm2";
  auto tok = Tokenizer::from_hf_dir(write_smollm2_tokenizer_json(dir));
  check_golden(*tok, testing::read_json_file(testing::data_path("tokenizer/hf_smollm2.json")), true);
  std::filesystem::remove_all(dir);
}

TEST(TokenizerHf, Errors) {
  const std::string dir = ::testing::TempDir() + "servetune_hf_errors";
  std::filesystem::create_directories(dir);
  auto expect_error = [&](const std::string& content, ErrorKind kind, const std::string& needle) {
    std::ofstream(dir + "/tokenizer.json") << content;
    try {
      Tokenizer::from_hf_dir(dir);
      ADD_FAILURE() << "no error for " << content;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("{not json", ErrorKind::kFormat, "invalid JSON");
  expect_error(R"({"model": {"type": "Unigram", "vocab": []}})", ErrorKind::kUnsupported, "Unigram");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2}, "merges": []}})", ErrorKind::kFormat, "id 1");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a c"]}})", ErrorKind::kFormat, "'c'");
  expect_error(R"({"normalizer": {"type": "NFC"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
               ErrorKind::kUnsupported, "NFC");
  expect_error(R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"},
                   "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})", ErrorKind::kUnsupported, "Split");
  std::filesystem::remove_all(dir);
  EXPECT_THROW(Tokenizer::from_hf_dir(dir), Error);
}

}  // namespace
}  // namespace servetune
