// The server's request parsing and validation (every user mistake is a 400 naming the field, never an exception of
// another kind), error bodies, JSON text helpers, response/chunk shapes (OpenAI schema) and the Prometheus text.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "server/api_error.h"
#include "server/json_text.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/prometheus.h"
#include "server/prompt_logprobs.h"
#include "servetune/sampling.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune::server {
namespace {

using nlohmann::json;

// Runs `fn`, expecting ApiError(400) naming `param` ("" = any).
template <typename Fn>
void expect_400(Fn fn, const std::string& param, const std::string& needle = "") {
  try {
    fn();
    ADD_FAILURE() << "no error (expected 400 on '" << param << "')";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    if (!param.empty()) {
      EXPECT_EQ(e.param(), param) << e.what();
    }
    if (!needle.empty()) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

void bad_completion(const std::string& body, const std::string& param, const std::string& needle = "") {
  SCOPED_TRACE(body);
  expect_400([&] { parse_completion_request(body); }, param, needle);
}

void bad_chat(const std::string& body, const std::string& param, const std::string& needle = "") {
  SCOPED_TRACE(body);
  expect_400([&] { parse_chat_request(body); }, param, needle);
}

TEST(ServerRequest, CompletionPromptForms) {
  auto r = parse_completion_request(R"({"model":"m","prompt":"hello"})");
  EXPECT_EQ(r.model, "m");
  ASSERT_TRUE(r.prompt_text);
  EXPECT_EQ(*r.prompt_text, "hello");
  EXPECT_EQ(r.sampling.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_FALSE(r.stream);

  r = parse_completion_request(R"({"prompt":[1,2,3]})");
  EXPECT_FALSE(r.prompt_text);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  r = parse_completion_request(R"({"prompt":["only one"]})");
  EXPECT_EQ(*r.prompt_text, "only one");
  r = parse_completion_request(R"({"prompt":[[5,6]]})");
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{5, 6}));

  bad_completion(R"({"prompt":["a","b"]})", "prompt", "batched prompts are not supported");
  bad_completion(R"({"prompt":[[1],[2]]})", "prompt", "batched");
  bad_completion(R"({"prompt":[]})", "prompt");
  bad_completion(R"({"prompt":[1,"x"]})", "prompt");
  bad_completion(R"({"prompt":[-1]})", "prompt");
  bad_completion(R"({"prompt":[99999999999]})", "prompt");
  bad_completion(R"({"prompt":{"a":1}})", "prompt");
  bad_completion(R"({"prompt":7})", "prompt");
  bad_completion(R"({"max_tokens":3})", "prompt", "required");
}

TEST(ServerRequest, MalformedBodies) {
  bad_completion("", "", "not valid JSON");
  bad_completion("{\"prompt\": ", "", "not valid JSON");
  bad_completion("[1,2]", "", "must be a JSON object");
  bad_completion("\"text\"", "", "must be a JSON object");
  bad_completion("{\"prompt\":\"\xff\"}", "", "not valid JSON");  // invalid UTF-8 in a string
  bad_chat("nul", "");
}

// nlohmann throws out_of_range, not parse_error, for a number beyond a double: still the client's input, so 400.
TEST(ServerRequest, NumbersBeyondADoubleAre400) {
  bad_completion(R"({"prompt":"p","max_tokens":1e400})", "", "number overflow");
  bad_completion(R"({"prompt":"p","temperature":-1e400})", "", "number overflow");
  bad_chat(R"({"messages":[{"role":"user","content":"hi"}],"seed":1e999})", "", "number overflow");
  for (const char* body : {R"({"prompt":"p","x":1e400})", R"({"tokens":[1e400]})"}) {
    SCOPED_TRACE(body);
    expect_400([&] { parse_tokenize_request(body); }, "", "number overflow");
    expect_400([&] { parse_detokenize_request(body); }, "", "number overflow");
  }
}

TEST(ServerRequest, SamplingFieldsAndTypes) {
  auto r = parse_completion_request(
      R"({"prompt":"p","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":-3,
          "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,"ignore_eos":true,"min_tokens":2,
          "stop":["a","bb"],"stop_token_ids":[2],"stream":true,"stream_options":{"include_usage":true},"logprobs":3,
          "user":"u","some_future_field":{"x":1},"suffix":null,"n":1,"echo":false,"best_of":1})");
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_EQ(r.sampling.min_tokens, 2);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"a", "bb"}));
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{2}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.sampling.logprobs, 3);

  r = parse_completion_request(R"({"prompt":"p","max_tokens":10.0,"temperature":null,"stop":"x","seed":18446744073709551615})");
  EXPECT_EQ(r.sampling.max_tokens, 10);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"x"}));
  EXPECT_EQ(r.sampling.seed, 18446744073709551615ull);

  bad_completion(R"({"prompt":"p","max_tokens":0})", "max_tokens", "at least 1");
  bad_completion(R"({"prompt":"p","max_tokens":-5})", "max_tokens");
  bad_completion(R"({"prompt":"p","max_tokens":"10"})", "max_tokens", "must be an integer");
  bad_completion(R"({"prompt":"p","max_tokens":10.5})", "max_tokens");
  bad_completion(R"({"prompt":"p","max_tokens":true})", "max_tokens");
  bad_completion(R"({"prompt":"p","temperature":"hot"})", "temperature", "must be a number");
  bad_completion(R"({"prompt":"p","temperature":-1})", "temperature");
  bad_completion(R"({"prompt":"p","top_p":0})", "top_p");
  bad_completion(R"({"prompt":"p","top_p":1.5})", "top_p");
  bad_completion(R"({"prompt":"p","min_p":2})", "min_p");
  bad_completion(R"({"prompt":"p","top_k":-2})", "top_k");
  bad_completion(R"({"prompt":"p","presence_penalty":3})", "presence_penalty");
  bad_completion(R"({"prompt":"p","frequency_penalty":-3})", "frequency_penalty");
  bad_completion(R"({"prompt":"p","repetition_penalty":0})", "repetition_penalty");
  bad_completion(R"({"prompt":"p","min_tokens":20})", "min_tokens");  // beyond the default max_tokens of 16
  bad_completion(R"({"prompt":"p","stop":[1]})", "stop");
  bad_completion(R"({"prompt":"p","stop":[""]})", "stop");
  bad_completion(R"({"prompt":"p","stop":5})", "stop");
  bad_completion(R"({"prompt":"p","logprobs":21})", "logprobs");
  bad_completion(R"({"prompt":"p","logprobs":true})", "logprobs");
  bad_completion(R"({"prompt":"p","seed":1.5})", "seed");
  bad_completion(R"({"prompt":"p","stream":"yes"})", "stream");
  bad_completion(R"({"prompt":"p","stream_options":{"include_usage":true}})", "stream_options", "only allowed");
  bad_completion(R"({"prompt":"p","stream":true,"stream_options":{"include_usage":1}})", "include_usage");
}

// n choices; best_of only as vLLM's V1 engine takes it (equal to n: no ranking of extra samples).
TEST(ServerRequest, ChoicesAndBestOf) {
  EXPECT_EQ(parse_completion_request(R"({"prompt":"p"})").n, 1);
  EXPECT_EQ(parse_completion_request(R"({"prompt":"p","n":3,"best_of":3})").n, 3);
  EXPECT_EQ(parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"n":2,"stream":true})").n, 2);
  EXPECT_EQ(parse_completion_request(R"({"prompt":"p","n":null,"best_of":null})").n, 1);
  bad_completion(R"({"prompt":"p","n":0})", "n");
  bad_completion(R"({"prompt":"p","n":100000})", "n");
  bad_completion(R"({"prompt":"p","n":1.5})", "n");
  bad_completion(R"({"prompt":"p","best_of":3})", "best_of", "must equal 'n' (1)");
  bad_completion(R"({"prompt":"p","n":2,"best_of":4})", "best_of", "must equal 'n' (2)");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"n":2,"best_of":1})", "best_of");
}

TEST(ServerRequest, OptionsThatWouldChangeTheOutputAreRejected) {
  bad_completion(R"({"prompt":"p","echo":true})", "echo");
  bad_completion(R"({"prompt":"p","suffix":"end"})", "suffix");
  bad_completion(R"({"prompt":"p","logit_bias":{"1":5}})", "logit_bias");
  bad_completion(R"({"prompt":"p","guided_json":{}})", "guided_json");
  bad_completion(R"({"prompt":"p","skip_special_tokens":false})", "skip_special_tokens");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})", "response_format");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"modalities":["audio"]})", "modalities");
  // No-op values pass.
  EXPECT_NO_THROW(parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}],"tool_choice":"none",
          "response_format":{"type":"text"},"logit_bias":{},"n":1,"modalities":["text"],"parallel_tool_calls":true})"));
}

// vLLM's prompt_logprobs: K in [0, 20] on /v1/completions, not with stream (as vLLM), not on chat; the legacy echo
// is refused with a pointer to it.
TEST(ServerRequest, PromptLogprobs) {
  EXPECT_EQ(parse_completion_request(R"({"prompt":[1,2]})").prompt_logprobs, -1);
  EXPECT_EQ(parse_completion_request(R"({"prompt":[1,2],"prompt_logprobs":0})").prompt_logprobs, 0);
  EXPECT_EQ(parse_completion_request(R"({"prompt":[1,2],"prompt_logprobs":20,"max_tokens":1})").prompt_logprobs, 20);
  EXPECT_EQ(parse_completion_request(R"({"prompt":"p","prompt_logprobs":null})").prompt_logprobs, -1);
  bad_completion(R"({"prompt":"p","prompt_logprobs":21})", "prompt_logprobs", "must be in [0, 20], got 21");
  bad_completion(R"({"prompt":"p","prompt_logprobs":-1})", "prompt_logprobs", "must be in [0, 20], got -1");
  bad_completion(R"({"prompt":"p","prompt_logprobs":"5"})", "prompt_logprobs", "must be an integer");
  bad_completion(R"({"prompt":"p","prompt_logprobs":1,"stream":true})", "prompt_logprobs", "not available when 'stream' is true");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"prompt_logprobs":1})", "prompt_logprobs", "/v1/completions only");
  bad_completion(R"({"prompt":"p","echo":true,"logprobs":1})", "echo", "send vLLM's 'prompt_logprobs'");
}

TEST(ServerRequest, ChatMessages) {
  auto r = parse_chat_request(
      R"({"model":"m","messages":[{"role":"developer","content":"be brief"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
          {"role":"assistant","content":null},{"role":"user","content":"c","name":"bob"}],
          "max_completion_tokens":5,"max_tokens":9,"logprobs":true,"top_logprobs":2})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.sampling.max_tokens, 5);  // max_completion_tokens wins
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_FALSE(r.add_special_tokens);

  r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"min_tokens":100})");
  EXPECT_FALSE(r.max_tokens_given);  // chat: max_tokens defaults to the rest of the context, checked later
  r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})");
  EXPECT_EQ(r.sampling.logprobs, 0);

  bad_chat(R"({"model":"m"})", "messages", "required");
  bad_chat(R"({"messages":[]})", "messages");
  bad_chat(R"({"messages":"hi"})", "messages");
  bad_chat(R"({"messages":[{"content":"x"}]})", "messages", "role");
  bad_chat(R"({"messages":[{"role":"wizard","content":"x"}]})", "messages", "wizard");
  bad_chat(R"({"messages":[{"role":"user"}]})", "messages", "content");
  bad_chat(R"({"messages":[{"role":"user","content":5}]})", "messages[0].content");
  bad_chat(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", "messages", "image_url");
  bad_chat(R"({"messages":[{"role":"assistant","content":null,"tool_calls":[]}]})", "messages", "tool calls");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs", "requires 'logprobs'");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs");
  bad_chat(R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})", "max_completion_tokens");
}

TEST(ServerRequest, TokenizeAndDetokenize) {
  auto t = parse_tokenize_request(R"({"model":"m","prompt":"hi","return_token_strs":true})");
  EXPECT_EQ(*t.prompt, "hi");
  EXPECT_TRUE(t.add_special_tokens);
  EXPECT_TRUE(t.return_token_strs);
  t = parse_tokenize_request(R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false})");
  EXPECT_FALSE(t.prompt);
  EXPECT_FALSE(t.add_special_tokens);
  EXPECT_FALSE(t.add_generation_prompt);
  expect_400([] { parse_tokenize_request(R"({"model":"m"})"); }, "");
  expect_400([] { parse_tokenize_request(R"({"prompt":"a","messages":[]})"); }, "");
  expect_400([] { parse_tokenize_request(R"({"prompt":3})"); }, "prompt");
  auto d = parse_detokenize_request(R"({"tokens":[1,2]})");
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{1, 2}));
  expect_400([] { parse_detokenize_request(R"({"tokens":"12"})"); }, "tokens");
  expect_400([] { parse_detokenize_request(R"({})"); }, "tokens");
}

TEST(ServerAuth, BearerComparison) {
  EXPECT_TRUE(bearer_matches("Bearer sekrit", "sekrit"));
  EXPECT_FALSE(bearer_matches("Bearer sekrix", "sekrit"));
  EXPECT_FALSE(bearer_matches("Bearer sekri", "sekrit"));
  EXPECT_FALSE(bearer_matches("Bearer sekrit2", "sekrit"));
  EXPECT_FALSE(bearer_matches("sekrit", "sekrit"));
  EXPECT_FALSE(bearer_matches("", "sekrit"));
  EXPECT_FALSE(bearer_matches("Bearer ", ""));
}

TEST(ServerErrors, BodyShapeAndMapping) {
  const json j = json::parse(ApiError(400, "bad \"x\"", "max_tokens").body());
  EXPECT_EQ(j["error"]["message"], "bad \"x\"");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_TRUE(j["error"]["code"].is_null());
  const json k = json::parse(ApiError(404, "no", "model", "model_not_found").body());
  EXPECT_EQ(k["error"]["code"], "model_not_found");
  EXPECT_TRUE(json::parse(ApiError(503, "busy").body())["error"]["param"].is_null());

  EXPECT_EQ(api_error_from(Error(ErrorKind::kInvalidRequest, "x")).status(), 400);
  EXPECT_EQ(api_error_from(Error(ErrorKind::kUsage, "x")).status(), 400);
  EXPECT_EQ(api_error_from(Error(ErrorKind::kUnsupported, "x")).status(), 400);
  EXPECT_EQ(api_error_from(Error(ErrorKind::kInternal, "x")).status(), 500);
  EXPECT_STREQ(status_reason(413), "Payload Too Large");
}

TEST(ServerJson, StringEscapingRepairsUtf8) {
  std::string out;
  const std::string valid = "a\"b\\c\n\t\x01 \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";
  append_json_string(out, valid);
  EXPECT_EQ(json::parse(out).get<std::string>(), valid);
  out.clear();
  append_json_string(out, "x\xE2\x82y\xFFz\xED\xA0\x80");  // truncated, invalid byte, surrogate
  EXPECT_EQ(json::parse(out).get<std::string>(), "x\xEF\xBF\xBDy\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  out.clear();
  append_json_number(out, -0.25);
  append_json_number(out, 3.0);
  EXPECT_EQ(out, "-0.253.0");
  out.clear();
  append_json_number(out, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(json::parse(out).get<double>(), -9999.0);
}

class ServerResponse : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf_ = std::make_unique<GgufFile>(testing::stories_path());
    tok_ = Tokenizer::from_gguf(*gguf_);
  }
  static void TearDownTestSuite() {
    tok_.reset();
    gguf_.reset();
  }
  static std::vector<json> events(const std::string& sse) {
    std::vector<json> out;
    size_t pos = 0;
    while ((pos = sse.find("data: ", pos)) != std::string::npos) {
      const size_t end = sse.find("\n\n", pos);
      out.push_back(json::parse(sse.substr(pos + 6, end - pos - 6)));
      pos = end;
    }
    return out;
  }
  static TokenEvent event(std::vector<int32_t> ids, std::string text, FinishReason f = FinishReason::kNone) {
    TokenEvent e;
    e.token_ids = std::move(ids);
    e.text = std::move(text);
    e.finish = f;
    e.usage = {5, 2, 1};
    return e;
  }
  static inline std::unique_ptr<GgufFile> gguf_;
  static inline std::unique_ptr<Tokenizer> tok_;
};

TEST_F(ServerResponse, ChatStreamChunks) {
  auto req = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}})");
  ResponseBuilder b(req, "chatcmpl-1", 123, "m", *tok_);
  const TokenEvent last = event({407}, " upon", FinishReason::kLength);
  std::string sse = b.stream_start() + b.stream_event(0, event({403}, " Once")) + b.stream_event(0, last) + b.stream_usage(last.usage);
  const auto ev = events(sse);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(ev[0]["id"], "chatcmpl-1");
  EXPECT_EQ(ev[0]["created"], 123);
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(ev[0]["usage"].is_null());
  EXPECT_EQ(ev[1]["choices"][0]["delta"]["content"], " Once");
  EXPECT_TRUE(ev[1]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(ev[2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(ev[3]["choices"].empty());
  EXPECT_EQ(ev[3]["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(ev[3]["usage"]["completion_tokens"], 2);
  EXPECT_EQ(ev[3]["usage"]["total_tokens"], 7);
  EXPECT_EQ(ev[3]["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
}

TEST_F(ServerResponse, CompletionWithLogprobs) {
  auto req = parse_completion_request(R"({"prompt":"x","logprobs":1})");
  ResponseBuilder b(req, "cmpl-1", 1, "m", *tok_);
  TokenEvent e1 = event({403}, " Once");
  e1.logprobs.push_back({403, -0.5f, {{403, -0.5f}, {407, -1.5f}}});
  TokenEvent e2 = event({407}, " upon", FinishReason::kStop);
  e2.logprobs.push_back({407, -0.25f, {{403, -0.1f}}});
  b.add(0, e1);
  b.add(0, e2);
  const json r = json::parse(b.response({e2.finish}, e2.usage));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], " Once upon");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  const json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({" Once", " upon"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(lp["text_offset"], json({0, 5}));
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);  // the sampled token is not repeated
  EXPECT_EQ(lp["top_logprobs"][1][" upon"], -0.25);
  EXPECT_EQ(lp["top_logprobs"][1][" Once"], -0.1);
  EXPECT_EQ(r["usage"]["total_tokens"], 7);
}

// vLLM's return_tokens_as_token_ids: every token a logprobs entry names is "token_id:N" (exact even where a piece is
// ambiguous or not UTF-8); the text and its offsets stay the text's.
TEST_F(ServerResponse, LogprobsNameTokensByIdWhenAsked) {
  auto req = parse_completion_request(R"({"prompt":"x","logprobs":1,"return_tokens_as_token_ids":true})");
  ResponseBuilder b(req, "cmpl-1", 1, "m", *tok_);
  TokenEvent e1 = event({403}, " Once");
  e1.logprobs.push_back({403, -0.5f, {{403, -0.5f}, {407, -1.5f}}});
  TokenEvent e2 = event({407}, " upon", FinishReason::kStop);
  e2.logprobs.push_back({407, -0.25f, {}});
  b.add(0, e1);
  b.add(0, e2);
  const json r = json::parse(b.response({e2.finish}, e2.usage));
  EXPECT_EQ(r["choices"][0]["text"], " Once upon");
  const json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"token_id:403", "token_id:407"}));
  EXPECT_EQ(lp["text_offset"], json({0, 5}));
  EXPECT_EQ(lp["top_logprobs"][0]["token_id:407"], -1.5);

  auto chat = parse_chat_request(
      R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":1,"return_tokens_as_token_ids":true})");
  ResponseBuilder c(chat, "c", 1, "m", *tok_);
  TokenEvent e = event({403}, " Once", FinishReason::kStop);
  e.logprobs.push_back({403, -0.5f, {{407, -0.7f}}});
  c.add(0, e);
  const json cr = json::parse(c.response({e.finish}, e.usage));
  const json& entry = cr["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(entry["token"], "token_id:403");
  EXPECT_EQ(entry["top_logprobs"][0]["token"], "token_id:407");
  EXPECT_FALSE(parse_completion_request(R"({"prompt":"x","logprobs":1})").tokens_as_ids);
  bad_completion(R"({"prompt":"x","return_tokens_as_token_ids":1})", "return_tokens_as_token_ids");
}

TEST_F(ServerResponse, ChatLogprobsAndErrorEvent) {
  auto req = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":1})");
  ResponseBuilder b(req, "c", 1, "m", *tok_);
  TokenEvent e = event({403}, " Once", FinishReason::kStop);
  e.logprobs.push_back({403, -0.5f, {{403, -0.5f}}});
  b.add(0, e);
  const json r = json::parse(b.response({e.finish}, e.usage));
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], " Once");
  const json& c = r["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(c["token"], " Once");
  EXPECT_EQ(c["bytes"], json({32, 79, 110, 99, 101}));
  EXPECT_EQ(c["top_logprobs"][0]["logprob"], -0.5);
  const auto err = events(ResponseBuilder::stream_error("boom", 500));
  EXPECT_EQ(err[0]["error"]["message"], "boom");
}

// n > 1: each choice carries its index, chat streams open with a role chunk per choice, and usage counts the prompt
// once and the completion tokens of every choice.
TEST_F(ServerResponse, SeveralChoices) {
  auto req = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"n":2,"stream":true,"stream_options":{"include_usage":true}})");
  ResponseBuilder b(req, "c", 1, "m", *tok_);
  TokenEvent a = event({403}, " Once", FinishReason::kStop);
  TokenEvent z = event({407, 403}, " upon Once", FinishReason::kLength);
  a.usage = {5, 1, 2};
  z.usage = {5, 2, 0};
  const Usage total = combined_usage({a.usage, z.usage});
  EXPECT_EQ(total.prompt_tokens, 5);
  EXPECT_EQ(total.completion_tokens, 3);
  EXPECT_EQ(total.cached_tokens, 2);
  const auto ev = events(b.stream_start() + b.stream_event(1, z) + b.stream_event(0, a) + b.stream_usage(total));
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[0]["choices"][0]["index"], 0);
  EXPECT_EQ(ev[1]["choices"][0]["index"], 1);
  EXPECT_EQ(ev[1]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(ev[2]["choices"][0]["index"], 1);
  EXPECT_EQ(ev[2]["choices"][0]["delta"]["content"], " upon Once");
  EXPECT_EQ(ev[3]["choices"][0]["index"], 0);
  EXPECT_EQ(ev[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ev[4]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(ev[4]["usage"]["total_tokens"], 8);

  auto plain = parse_completion_request(R"({"prompt":"x","n":2})");
  ResponseBuilder p(plain, "cmpl-2", 1, "m", *tok_);
  p.add(1, z);
  p.add(0, a);
  const json r = json::parse(p.response({a.finish, z.finish}, total));
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["text"], " Once");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["text"], " upon Once");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
}

TEST(ServerMetricsText, PrometheusFormat) {
  ServerMetrics m;
  m.ttft.observe(0.003);
  m.ttft.observe(0.5);
  m.ttft.observe(1e6);
  m.count_finish(FinishReason::kStop);
  m.count_response(200);
  EngineStats s;
  s.running = 2;
  s.waiting = 1;
  s.kv_blocks_used = 1;
  s.kv_blocks_total = 4;
  s.generation_tokens = 42;
  s.spec_num_drafts = 5;
  s.spec_draft_tokens = 20;
  s.spec_accepted_tokens = 7;
  s.spec_accepted_per_position = {4, 3};
  s.comm_seconds = 1.5;
  const std::string text = render_metrics(m, s, "my \"model\"", true);
  EXPECT_EQ(render_metrics(m, s, "m", false).find("spec_decode"), std::string::npos) << "counters without speculation";
  auto has = [&](const std::string& line) { EXPECT_NE(text.find(line + "\n"), std::string::npos) << line; };
  has(R"(vllm:num_requests_running{model_name="my \"model\""} 2)");
  has(R"(vllm:num_requests_waiting{model_name="my \"model\""} 1)");
  has(R"(vllm:kv_cache_usage_perc{model_name="my \"model\""} 0.25)");
  has(R"(vllm:generation_tokens_total{model_name="my \"model\""} 42)");
  has("# TYPE vllm:time_to_first_token_seconds histogram");
  has(R"(vllm:time_to_first_token_seconds_bucket{model_name="my \"model\"",le="0.001"} 0)");
  has(R"(vllm:time_to_first_token_seconds_bucket{model_name="my \"model\"",le="0.005"} 1)");
  has(R"(vllm:time_to_first_token_seconds_bucket{model_name="my \"model\"",le="0.5"} 2)");
  has(R"(vllm:time_to_first_token_seconds_bucket{model_name="my \"model\"",le="+Inf"} 3)");
  has(R"(vllm:time_to_first_token_seconds_count{model_name="my \"model\""} 3)");
  has(R"(vllm:request_success_total{model_name="my \"model\"",finished_reason="stop"} 1)");
  has(R"(servetune:http_responses_total{model_name="my \"model\"",status="200"} 1)");
  has(R"(servetune:comm_seconds_total{model_name="my \"model\""} 1.5)");
  has(R"(vllm:spec_decode_num_drafts_total{model_name="my \"model\""} 5)");
  has(R"(vllm:spec_decode_num_draft_tokens_total{model_name="my \"model\""} 20)");
  has(R"(vllm:spec_decode_num_accepted_tokens_total{model_name="my \"model\""} 7)");
  has(R"(vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="my \"model\"",position="1"} 3)");
  // Every non-comment line is "name{labels} value".
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# ", 0) == 0) continue;
    EXPECT_NE(line.find("} "), std::string::npos) << line;
  }
}

// The log-softmax of `row` at `token`, computed here the long way.
double reference_logprob(const std::vector<float>& row, int32_t token) {
  double sum = 0.0;
  for (float x : row) sum += std::exp(static_cast<double>(x));
  return static_cast<double>(row[static_cast<size_t>(token)]) - std::log(sum);
}

// vLLM's shape: null for the first prompt token, then per position a dict keyed by token id whose first entry is the
// prompt token (its rank counts the tokens at least as likely), then the top K not already there, ranked 1..K with
// ties by token id; rows may arrive in pieces, and rows that do not fit the prompt leave it incomplete.
TEST_F(ServerResponse, PromptLogprobsShape) {
  const int64_t vocab = tok_->vocab_size();
  std::vector<float> row0(static_cast<size_t>(vocab), 0.0f), row1(static_cast<size_t>(vocab), 0.0f);
  row0[403] = 2.0f;  // the prompt token, second most likely
  row0[10] = 3.0f;
  row1[407] = -1.0f;  // the prompt token, less likely than every other token
  PromptLogprobs p({1, 403, 407}, 2, vocab, *tok_);
  EXPECT_FALSE(p.complete());
  p.add_rows(row0);
  EXPECT_FALSE(p.complete());
  p.add_rows(row1);
  ASSERT_TRUE(p.complete());
  const auto j = nlohmann::ordered_json::parse(p.json());
  ASSERT_EQ(j.size(), 3u);
  EXPECT_TRUE(j[0].is_null());
  ASSERT_EQ(j[1].size(), 2u);  // the prompt token is among the top 2
  EXPECT_EQ(j[1].begin().key(), "403");
  EXPECT_EQ(j[1]["403"]["rank"], 2);
  EXPECT_EQ(j[1]["403"]["decoded_token"], tok_->token_to_piece(403));
  EXPECT_NEAR(j[1]["403"]["logprob"].get<double>(), reference_logprob(row0, 403), 1e-12);
  EXPECT_EQ(j[1]["10"]["rank"], 1);
  EXPECT_NEAR(j[1]["10"]["logprob"].get<double>(), reference_logprob(row0, 10), 1e-12);
  ASSERT_EQ(j[2].size(), 3u);  // K + 1: the prompt token is not among them
  EXPECT_EQ(j[2].begin().key(), "407");
  EXPECT_EQ(j[2]["407"]["rank"], vocab);
  EXPECT_EQ(j[2]["0"]["rank"], 1);
  EXPECT_EQ(j[2]["1"]["rank"], 2);
  EXPECT_NEAR(j[2]["0"]["logprob"].get<double>(), reference_logprob(row1, 0), 1e-12);

  PromptLogprobs zero({1, 403}, 0, vocab, *tok_);
  zero.add_rows(row0);
  EXPECT_EQ(nlohmann::json::parse(zero.json())[1].size(), 1u);  // K = 0: the prompt token alone
  PromptLogprobs extra({1, 403}, 1, vocab, *tok_);
  extra.add_rows(std::vector<float>(2 * static_cast<size_t>(vocab), 0.0f));  // a row for a position it does not have
  EXPECT_FALSE(extra.complete());
  PromptLogprobs partial({1, 403}, 1, vocab, *tok_);
  partial.add_rows(std::vector<float>(static_cast<size_t>(vocab) - 1, 0.0f));
  EXPECT_FALSE(partial.complete());
}

// Every choice of a request gets the prompt's list; without prompt_logprobs there is no such field.
TEST_F(ServerResponse, PromptLogprobsInEveryChoice) {
  auto req = parse_completion_request(R"({"prompt":[1,403],"n":2,"prompt_logprobs":1})");
  ResponseBuilder b(req, "cmpl-3", 1, "m", *tok_);
  const TokenEvent e = event({407}, " upon", FinishReason::kLength);
  b.add(0, e);
  b.add(1, e);
  const std::string list = R"([null,{"403":{"logprob":-0.5,"rank":1,"decoded_token":" Once"}}])";
  const json r = json::parse(b.response({e.finish, e.finish}, e.usage, &list));
  EXPECT_EQ(r["choices"][0]["prompt_logprobs"], json::parse(list));
  EXPECT_EQ(r["choices"][1]["prompt_logprobs"], json::parse(list));
  EXPECT_FALSE(json::parse(b.response({e.finish, e.finish}, e.usage))["choices"][0].contains("prompt_logprobs"));
}

}  // namespace
}  // namespace servetune::server
