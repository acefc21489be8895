// Chat templates against jinja2 renderings (tests/data/tokenizer/chat_templates.json): SmolLM2's template
// (ChatML with a default system prompt), plain ChatML, Qwen2.5, Llama-2, Llama-3 / 3.1 / 3.3; templates we do
// not recognise (Gemma, Mistral) must be refused with Error(kUnsupported).
#include <gtest/gtest.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/test_tokenizer_util.h"

namespace servetune {
namespace {

using nlohmann::json;

TEST(TokenizerChat, MatchesJinja) {
  json golden = testing::read_json_file(testing::data_path("tokenizer/chat_templates.json"));
  int rendered = 0;
  for (const json& t : golden["templates"]) {
    const std::string name = t["name"], text = t["template"], family = t["family"];
    EXPECT_EQ(detect_chat_template(text), family) << name;
    for (const json& c : t["cases"]) {
      std::vector<ChatMessage> msgs;
      for (const json& m : c["messages"]) msgs.push_back({m[0], m[1]});
      const bool gen = c["add_generation_prompt"];
      SCOPED_TRACE(name + " with " + c["messages"].dump() + " add_generation_prompt=" + (gen ? "true" : "false"));
      if (family.empty()) {
        try {
          apply_chat_template(text, msgs, gen, t["bos"].get<std::string>(), t["eos"].get<std::string>());
          ADD_FAILURE() << "unrecognised template rendered";
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
          EXPECT_NE(std::string(e.what()).find("not recognised"), std::string::npos) << e.what();
        }
        continue;
      }
      if (c.contains("error")) {
        EXPECT_THROW(apply_chat_template(text, msgs, gen, t["bos"].get<std::string>(), t["eos"].get<std::string>()), Error);
        continue;
      }
      EXPECT_EQ(apply_chat_template(text, msgs, gen, t["bos"].get<std::string>(), t["eos"].get<std::string>()),
                c["expected"].get<std::string>());
      ++rendered;
    }
  }
  EXPECT_GT(rendered, 40);
}

TEST(TokenizerChat, SmolLM2FromGguf) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  GgufFile f(testing::smollm2_path());
  auto tok = Tokenizer::from_gguf(f);
  std::string s = apply_chat_template(*tok, {{"user", "Hi"}}, true);
  EXPECT_EQ(s, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto ids = tok->encode(s, true, true);
  EXPECT_EQ(ids.front(), tok->find_token("<|im_start|>"));
}

TEST(TokenizerChat, NoTemplateIsUnsupported) {
  GgufFile f(testing::stories_path());
  auto tok = Tokenizer::from_gguf(f);
  try {
    apply_chat_template(*tok, {{"user", "Hi"}}, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("stories260K.gguf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune
