// libFuzzer target: the load generator's client-side SSE stream parser and its OpenAI chunk parser. The first byte
// picks the API kind and how the rest is cut into pieces; the events must not depend on the cuts (one feed versus
// many), and StreamChunkParser's fast path must give what parse_stream_chunk gives on every event's data.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen/sse_parser.h"
#include "loadgen/stream_chunk.h"

namespace {

using servetune::loadgen::SseEvent;

struct Seen {
  std::string type, data, id;
  int64_t sent_ns;
  bool operator==(const Seen&) const = default;
};

struct Parsed {
  std::vector<Seen> events;
  int64_t comments, malformed;
  bool operator==(const Parsed&) const = default;
};

// Feeds `bytes` in pieces of `cut` bytes (0: all at once), then ends the stream.
Parsed parse_all(std::string_view bytes, size_t cut) {
  servetune::loadgen::SseParser p;
  Parsed out;
  auto on = [&](const SseEvent& e) {
    out.events.push_back({std::string(e.type), std::string(e.data), std::string(e.id), e.sent_ns});
  };
  if (cut == 0) {
    p.feed(bytes, on);
  } else {
    for (size_t i = 0; i < bytes.size(); i += cut) p.feed(bytes.substr(i, cut), on);
  }
  p.finish(on);
  out.comments = p.comments();
  out.malformed = p.malformed();
  return out;
}

bool same(const servetune::loadgen::StreamChunk& a, const servetune::loadgen::StreamChunk& b) {
  return a.done == b.done && a.has_choices == b.has_choices && a.text == b.text && a.has_usage == b.has_usage &&
         a.prompt_tokens == b.prompt_tokens && a.completion_tokens == b.completion_tokens && a.error == b.error &&
         a.server_error == b.server_error;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace servetune::loadgen;
  if (size == 0) return 0;
  const ApiKind kind = data[0] & 1 ? ApiKind::kChat : ApiKind::kCompletions;
  const size_t cut = 1 + (data[0] >> 1) % 7;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const Parsed whole = parse_all(bytes, 0);
  if (parse_all(bytes, cut) != whole || parse_all(bytes, 1) != whole) std::abort();

  StreamChunkParser fast;
  StreamChunk a, b;
  for (const Seen& e : whole.events) {
    parse_stream_chunk(e.data, kind, a);
    fast.parse(e.data, kind, b);
    if (!same(a, b)) std::abort();
  }
  return 0;
}
