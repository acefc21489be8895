// SSE parser: every split of the byte stream gives the same events; comments, CRLF / CR / LF line ends,
// multi-line data, BOM, unknown fields, send stamps and end of stream. OpenAI chunk payloads: text, usage, errors.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/sse_parser.h"
#include "loadgen/stream_chunk.h"

namespace servetune::loadgen {
namespace {

struct Collected {
  std::vector<std::string> data;
  std::vector<std::string> types;
  std::vector<std::string> ids;
  std::vector<int64_t> stamps;
};

// An event handler that appends each event to `c`.
auto collect_into(Collected& c) {
  return [&c](const SseEvent& e) {
    c.data.emplace_back(e.data);
    c.types.emplace_back(e.type);
    c.ids.emplace_back(e.id);
    c.stamps.push_back(e.sent_ns);
  };
}

Collected parse_pieces(const std::vector<std::string>& pieces, bool finish = true) {
  SseParser p;
  Collected c;
  const auto on = collect_into(c);
  for (const std::string& s : pieces) p.feed(s, on);
  if (finish) p.finish(on);
  return c;
}

// A stream with every feature; its events whatever way it is split.
const std::string kStream =
    "\xEF\xBB\xBF: comment line\r\n"
    "data: {\"a\":1}\r\n\r\n"
    "data:{\"b\":2}\n\n"
    "event: ping\rid: 7\rdata: x\r\r"
    "data: line1\ndata: line2\ndata\n\n"
    "retry: 100\n"
    "sent-ns: 123456789012\n"
    "data:  two spaces\n\n"
    "sent-ns:7\r\n: c\r\n\r\n"
    "data: [DONE]\r\nsent-ns: 0042\r\n\r\n";
const std::vector<std::string> kData = {"{\"a\":1}", "{\"b\":2}", "x", "line1\nline2\n", " two spaces", "[DONE]"};
// Each event's own stamp; the one of an event without data ("sent-ns:7" then a blank line) is dropped with it.
const std::vector<int64_t> kStamps = {-1, -1, -1, -1, 123456789012, 42};

TEST(SseParser, WholeStream) {
  const Collected c = parse_pieces({kStream});
  EXPECT_EQ(c.data, kData);
  EXPECT_EQ(c.types[2], "ping");
  EXPECT_EQ(c.types[3], "");  // the event type resets after dispatch
  EXPECT_EQ(c.ids[2], "7");
  EXPECT_EQ(c.ids[5], "7");  // the last event id persists
  EXPECT_EQ(c.stamps, kStamps);
}

TEST(SseParser, EverySplitPointAndByteByByte) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    const Collected c = parse_pieces({kStream.substr(0, cut), kStream.substr(cut)});
    EXPECT_EQ(c.data, kData) << "cut at " << cut;
    EXPECT_EQ(c.stamps, kStamps) << "cut at " << cut;
  }
  for (size_t a = 0; a <= kStream.size(); a += 3) {
    for (size_t b = a; b <= kStream.size(); b += 5) {
      const Collected c = parse_pieces({kStream.substr(0, a), kStream.substr(a, b - a), kStream.substr(b)});
      EXPECT_EQ(c.data, kData);
      EXPECT_EQ(c.stamps, kStamps);
    }
  }
  std::vector<std::string> bytes;
  for (char ch : kStream) bytes.emplace_back(1, ch);
  EXPECT_EQ(parse_pieces(bytes).data, kData);
  EXPECT_EQ(parse_pieces(bytes).stamps, kStamps);
}

TEST(SseParser, CommentsUnknownFieldsAndEmptyEvents) {
  SseParser p;
  std::vector<std::string> got;
  const auto on = [&](const SseEvent& e) { got.emplace_back(e.data); };
  p.feed(": ping\n\n\n: another\nevent: x\n\ndata:\n\n", on);
  EXPECT_EQ(got, (std::vector<std::string>{""}));  // "data:" with nothing is one empty event; blank lines are not
  EXPECT_EQ(p.comments(), 2);
  EXPECT_EQ(p.malformed(), 0);
  p.feed("{\"choices\":[]}\n\n", on);  // a payload without "data:" is a field named {"choices"
  EXPECT_EQ(p.malformed(), 1);
  EXPECT_EQ(p.first_malformed(), "unexpected field '{\"choices\"'");
  EXPECT_EQ(got.size(), 1u);
}

TEST(SseParser, BadStampsAreMalformed) {
  for (const std::string bad :
       {"sent-ns: -5", "sent-ns: 12x", "sent-ns:", "sent-ns: 1234567890123456789", "sent-ns: 1 "}) {
    SseParser p;
    std::vector<int64_t> stamps;
    p.feed(bad + "\ndata: x\n\n", [&](const SseEvent& e) { stamps.push_back(e.sent_ns); });
    EXPECT_EQ(p.malformed(), 1) << bad;
    EXPECT_EQ(p.first_malformed().rfind("sent-ns is not a decimal integer: '", 0), 0u) << p.first_malformed();
    EXPECT_EQ(stamps, (std::vector<int64_t>{-1})) << bad;
  }
  SseParser p;
  int64_t stamp = 0;
  p.feed("sent-ns: 999999999999999999\ndata: x\n\n", [&](const SseEvent& e) { stamp = e.sent_ns; });
  EXPECT_EQ(stamp, 999999999999999999);  // 18 digits: the largest accepted
  EXPECT_EQ(p.malformed(), 0);
}

TEST(SseParser, FinishFlushesAnUnterminatedEvent) {
  Collected c = parse_pieces({"data: [DONE]"});
  EXPECT_EQ(c.data, (std::vector<std::string>{"[DONE]"}));
  c = parse_pieces({"data: {\"a\":", "1"}, false);
  EXPECT_TRUE(c.data.empty());  // nothing is dispatched before the blank line
  SseParser p;
  const auto none = [](const SseEvent&) {};
  p.feed("data: x\n\n", none);
  EXPECT_FALSE(p.finish(none));  // nothing pending
  p.feed("data: y\n", none);
  EXPECT_TRUE(p.finish(none));
}

TEST(SseParser, CrAtTheEndOfOneChunkAndLfAtTheStartOfTheNext) {
  EXPECT_EQ(parse_pieces({"data: a\r", "\n\r", "\ndata: b\r", "\r"}).data, (std::vector<std::string>{"a", "b"}));
}


// A pooled parser is reset between streams: nothing of a stream cut anywhere (half a line, an event without its
// blank line, a line ended by a lone CR, a BOM checked or not yet, an unknown field) leaks into the next one.
TEST(SseParser, ResetStartsAFreshStream) {
  const std::string next = "\xEF\xBB\xBF" "data: {\"n\":1}\n\nevent: e\nid: 3\ndata: z\nsent-ns: 5\n\n";
  const Collected want = parse_pieces({next});
  for (const std::string prefix : {"", "bogus: 1\n"}) {
    for (size_t cut = 0; cut <= 2 * kStream.size() + 1; ++cut) {
      SseParser p;
      Collected got;
      const auto on = collect_into(got);
      p.feed(prefix + kStream.substr(0, cut / 2) + (cut % 2 == 1 ? "\r" : ""), [](const SseEvent&) {});
      p.reset();
      p.feed(next, on);
      p.finish(on);
      EXPECT_EQ(p.malformed(), 0);
      EXPECT_EQ(got.stamps, want.stamps) << "cut at " << cut;
      EXPECT_EQ(got.data, want.data) << "cut at " << cut;
      EXPECT_EQ(got.types, want.types) << "cut at " << cut;
      EXPECT_EQ(got.ids, want.ids) << "cut at " << cut;
    }
  }
}

TEST(StreamChunk, CompletionsChatUsageAndErrors) {
  StreamChunk c;
  parse_stream_chunk(R"({"choices":[{"index":0,"text":" hi","finish_reason":null}],"usage":null})", ApiKind::kCompletions, c);
  EXPECT_TRUE(c.has_choices);
  EXPECT_EQ(c.text, " hi");
  EXPECT_FALSE(c.has_usage);
  parse_stream_chunk(R"({"choices":[{"delta":{"role":"assistant"}}]})", ApiKind::kChat, c);
  EXPECT_TRUE(c.has_choices);  // a content chunk even without content, as vLLM counts it
  EXPECT_EQ(c.text, "");
  parse_stream_chunk(R"({"choices":[{"delta":{"content":"yo"}}]})", ApiKind::kChat, c);
  EXPECT_EQ(c.text, "yo");
  parse_stream_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}})",
                     ApiKind::kCompletions, c);
  EXPECT_FALSE(c.has_choices);
  EXPECT_TRUE(c.has_usage);
  EXPECT_EQ(c.prompt_tokens, 12);
  EXPECT_EQ(c.completion_tokens, 30);
  parse_stream_chunk("[DONE]", ApiKind::kChat, c);
  EXPECT_TRUE(c.done);
  parse_stream_chunk("{not json", ApiKind::kCompletions, c);
  EXPECT_NE(c.error.find("malformed JSON"), std::string::npos);
  EXPECT_FALSE(c.server_error);
  parse_stream_chunk("[1,2]", ApiKind::kCompletions, c);
  EXPECT_NE(c.error.find("not a JSON object"), std::string::npos);
  EXPECT_FALSE(c.server_error);
  parse_stream_chunk(R"({"error":{"message":"out of memory","code":500}})", ApiKind::kCompletions, c);
  EXPECT_EQ(c.error, "server error in stream: out of memory");
  EXPECT_TRUE(c.server_error);
  parse_stream_chunk(R"({"choices":[{"text":"a"}],"error":null})", ApiKind::kCompletions, c);
  EXPECT_TRUE(c.error.empty());
  EXPECT_FALSE(c.server_error);
}

// What parse_stream_chunk must extract, computed with nlohmann::json's DOM.
StreamChunk reference(std::string_view data, ApiKind kind) {
  StreamChunk c;
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded()) {
    c.error = "malformed";
    return c;
  }
  if (!j.is_object()) {
    c.error = "not an object";
    return c;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    c.error = "server error";
    return c;
  }
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    c.has_choices = true;
    const auto& first = (*ch)[0];
    const nlohmann::json* holder = first.is_object() ? &first : nullptr;
    if (holder != nullptr && kind == ApiKind::kChat) {
      auto d = first.find("delta");
      holder = d != first.end() && d->is_object() ? &*d : nullptr;
    }
    if (holder != nullptr) {
      auto t = holder->find(kind == ApiKind::kChat ? "content" : "text");
      if (t != holder->end() && t->is_string()) c.text = t->get<std::string>();
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    c.has_usage = true;
    auto pt = u->find("prompt_tokens");
    auto ct = u->find("completion_tokens");
    c.prompt_tokens = pt != u->end() && pt->is_number_integer() ? pt->get<int64_t>() : -1;
    c.completion_tokens = ct != u->end() && ct->is_number_integer() ? ct->get<int64_t>() : -1;
  }
  return c;
}

void expect_same(std::string_view data, ApiKind kind) {
  StreamChunk got;
  parse_stream_chunk(data, kind, got);
  const StreamChunk want = reference(data, kind);
  SCOPED_TRACE(std::string(data));
  EXPECT_EQ(got.server_error, want.error == "server error");
  if (want.error == "malformed") {
    EXPECT_NE(got.error.find("malformed JSON"), std::string::npos);
  } else if (want.error == "not an object") {
    EXPECT_NE(got.error.find("not a JSON object"), std::string::npos);
  } else if (want.error == "server error") {
    EXPECT_NE(got.error.find("server error"), std::string::npos);
  } else {
    ASSERT_EQ(got.error, "");
    EXPECT_EQ(got.has_choices, want.has_choices);
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(got.has_usage, want.has_usage);
    EXPECT_EQ(got.prompt_tokens, want.prompt_tokens);
    EXPECT_EQ(got.completion_tokens, want.completion_tokens);
  }
}

// Real payload shapes and odd but valid JSON (escapes, surrogate pairs, whitespace, nested values, errors).
const std::vector<std::pair<std::string, ApiKind>> kPayloads = {
    {R"({"id":"cmpl-1","object":"text_completion","created":0,"model":"m","choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null})", ApiKind::kCompletions},
    {R"({"choices":[{"text":"a\"b\\c\/\n\t\u00e9\ud83d\ude00 é","index":0}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":0}},"timings":{"prompt_ms":1.5e3,"x":[true,false,null,-0.5E-2]}})", ApiKind::kCompletions},
    {R"( { "choices" : [ { "finish_reason" : null , "index" : 0 , "delta" : { "role" : "assistant" , "content" : "Hi" } } , {"delta":{"content":"no"}} ] } )", ApiKind::kChat},
    {R"({"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],"usage":{"prompt_tokens":4,"completion_tokens":1}})", ApiKind::kChat},
    {R"({"choices":[],"usage":{"prompt_tokens":12.0,"completion_tokens":-7}})", ApiKind::kChat},
    {R"({"choices":[{"delta":{}}],"error":null})", ApiKind::kChat},
    {R"({"error":{"message":"boom","code":500}})", ApiKind::kCompletions},
    {R"([1,2,{"a":"b"}])", ApiKind::kCompletions},
    {R"("just a string")", ApiKind::kCompletions},
};

// Every truncation of `text` and every single-byte corruption at an ASCII position (nlohmann rejects invalid
// UTF-8, which the scanner accepts).
std::vector<std::string> broken_variants(const std::string& text) {
  std::vector<std::string> out;
  for (size_t cut = 0; cut < text.size(); ++cut) {
    if ((static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) continue;  // inside a UTF-8 sequence
    out.push_back(text.substr(0, cut));
  }
  const std::string replacements = "}{],[\":x 0-.e\x01\\";
  for (size_t i = 0; i < text.size(); ++i) {
    if (static_cast<unsigned char>(text[i]) >= 0x80) continue;
    for (char r : replacements) {
      std::string mutated = text;
      mutated[i] = r;
      out.push_back(mutated);
    }
  }
  return out;
}

// The scanner against nlohmann::json on the payloads, every truncation and single-byte corruptions.
TEST(StreamChunk, AgreesWithNlohmannOnValidAndBrokenPayloads) {
  for (const auto& [text, kind] : kPayloads) {
    expect_same(text, kind);
    for (const std::string& broken : broken_variants(text)) expect_same(broken, kind);
  }
}

// The stream parser checks only the text of a payload that repeats the last one around it: after any payload, it
// gives parse_stream_chunk's results (error messages included) on the same payload with other texts (escaped,
// empty, long, with an unescaped quote or backslash that changes the structure), and on every broken variant.
TEST(StreamChunk, StreamParserMatchesTheFullScanAfterAnyPayload) {
  const std::vector<std::string> texts = {"", "a\\\"b", "\\u00e9\\ud83d\\ude00", std::string(100, 'w'), "q\"",
                                          "tail\\", "\x01", "tok\",\"text\":\"again", "\\x"};
  const auto expect_equal = [](const StreamChunk& got, const StreamChunk& want, const std::string& data) {
    SCOPED_TRACE(data);
    EXPECT_EQ(got.done, want.done);
    EXPECT_EQ(got.has_choices, want.has_choices);
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(got.has_usage, want.has_usage);
    EXPECT_EQ(got.prompt_tokens, want.prompt_tokens);
    EXPECT_EQ(got.completion_tokens, want.completion_tokens);
    EXPECT_EQ(got.error, want.error);
    EXPECT_EQ(got.server_error, want.server_error);
  };
  int fast_path_candidates = 0;
  for (const auto& [first, kind] : kPayloads) {
    std::vector<std::string> next = broken_variants(first);
    next.push_back(first);
    next.push_back("[DONE]");
    for (const char* key : {"\"text\":\"", "\"content\" : \"", "\"content\":\""}) {
      const size_t at = first.find(key);
      if (at == std::string::npos) continue;
      const size_t begin = at + std::strlen(key), end = first.find('"', begin);
      for (const std::string& t : texts) next.push_back(first.substr(0, begin) + t + first.substr(end));
      fast_path_candidates += static_cast<int>(texts.size());
    }
    for (const std::string& data : next) {
      StreamChunkParser parser;
      StreamChunk got, want;
      parser.parse(first, kind, got);
      parser.parse(data, kind, got);
      parse_stream_chunk(data, kind, want);
      expect_equal(got, want, data);
      parser.parse(first, kind, got);  // and back to the first payload
      parse_stream_chunk(first, kind, want);
      expect_equal(got, want, first);
    }
  }
  EXPECT_GE(fast_path_candidates, 3 * 9);  // three payloads have a text string to vary
}

}  // namespace
}  // namespace servetune::loadgen
