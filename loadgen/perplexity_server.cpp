// Chunks scored through a server's prompt_logprobs (see perplexity_server.h). Requests run on their own threads, as
// many as PerplexityOptions::in_flight lets measure_perplexity submit ahead.
#include "loadgen/perplexity_server.h"

#include <algorithm>
#include <charconv>
#include <deque>
#include <future>

#include <nlohmann/json.hpp>

#include "loadgen/http_request.h"
#include "servetune/error.h"

namespace servetune::loadgen {
namespace {

using nlohmann::json;

std::string snippet(const std::string& s, size_t n = 300) {
  std::string out = s.substr(0, n);
  std::replace(out.begin(), out.end(), '\n', ' ');
  return s.size() > n ? out + "..." : out;
}

// The server's own words for a refused request: OpenAI's {"error": {"message"}}, else the body's start.
std::string error_text(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  if (j.is_object() && j.contains("detail")) return j["detail"].dump();  // FastAPI's validation errors
  return snippet(body);
}

std::string request_body(const ServerEndpoint& s, const std::vector<int32_t>& chunk) {
  json j;
  if (!s.model.empty()) j["model"] = s.model;
  j["prompt"] = chunk;
  j["max_tokens"] = 1;
  j["temperature"] = 0;
  j["prompt_logprobs"] = s.top_logprobs;
  return j.dump();
}

class ServerScorer : public ChunkScorer {
 public:
  ServerScorer(ServerEndpoint server, int32_t vocab) : server_(std::move(server)), url_(completions_url(server_.url)), vocab_(vocab) {}
  bool dense() const override { return false; }
  int32_t vocab() const override { return vocab_; }

  void submit(const std::vector<int32_t>& chunk) override {
    const std::string body = request_body(server_, chunk);
    const auto timeout_ms = static_cast<long>(server_.request_timeout_s * 1000.0);
    in_flight_.push_back({chunk, std::async(std::launch::async, [url = url_, body, timeout_ms, key = server_.api_key] {
                            return http_request(url, timeout_ms, key, &body);
                          })});
  }

  void score_next(const std::function<void(const PositionLogprobs&)>& sink) override {
    auto [chunk, pending] = std::move(in_flight_.front());
    in_flight_.pop_front();
    const HttpReply reply = pending.get();
    if (!reply.transport_error.empty()) throw Error(ErrorKind::kIo, url_ + ": " + reply.transport_error);
    if (reply.status != 200) {
      throw Error(reply.status >= 400 && reply.status < 500 ? ErrorKind::kUnsupported : ErrorKind::kIo,
                  url_ + ": HTTP " + std::to_string(reply.status) + " for a request with prompt_logprobs " +
                      std::to_string(server_.top_logprobs) + ": " + error_text(reply.body));
    }
    for (const PositionLogprobs& p : parse_prompt_logprobs(reply.body, chunk, static_cast<int>(chunk.size() / 2), url_)) sink(p);
  }

 private:
  ServerEndpoint server_;
  std::string url_;
  int32_t vocab_;
  std::deque<std::pair<std::vector<int32_t>, std::future<HttpReply>>> in_flight_;
};

// A dict key, which vLLM writes as the token id in decimal.
bool token_key(const std::string& key, int32_t& id) {
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
  return ec == std::errc() && end == key.data() + key.size() && id >= 0;
}

}  // namespace

std::string completions_url(const std::string& url) {
  std::string u = url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  if (u.ends_with("/v1/completions")) return u;
  if (u.ends_with("/v1")) return u + "/completions";
  return u + "/v1/completions";
}

std::vector<PositionLogprobs> parse_prompt_logprobs(const std::string& body, const std::vector<int32_t>& chunk, int first,
                                                    const std::string& url) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) throw_format(url, "the response is not JSON: " + snippet(body));
  const json* choices = j.is_object() && j.contains("choices") ? &j["choices"] : nullptr;
  if (!choices || !choices->is_array() || choices->empty() || !(*choices)[0].is_object()) {
    throw_format(url, "the response has no choices: " + snippet(body));
  }
  const json& choice = (*choices)[0];
  const auto it = choice.find("prompt_logprobs");
  if (it == choice.end() || it->is_null()) {
    throw Error(ErrorKind::kUnsupported,
                url + ": the response has no 'prompt_logprobs' (choices[0]): the server ignores vLLM's prompt_logprobs "
                      "extension, which perplexity and accuracy against a server need (vLLM and servetune serve have it)");
  }
  const json& entries = *it;
  if (!entries.is_array() || entries.size() != chunk.size()) {
    throw_format(url, "'prompt_logprobs' must list one entry per prompt token (" + std::to_string(chunk.size()) + "), got " +
                          (entries.is_array() ? std::to_string(entries.size()) + " entries" : std::string("a ") + entries.type_name()));
  }
  std::vector<PositionLogprobs> out;
  for (size_t p = static_cast<size_t>(std::max(first, 0)); p + 1 < chunk.size(); ++p) {
    const json& e = entries[p + 1];
    const std::string where = "prompt_logprobs[" + std::to_string(p + 1) + "]";
    if (!e.is_object()) throw_format(url, where + " must be a dict of token id -> {logprob, ...}, got " + e.type_name());
    PositionLogprobs pos;
    pos.target = chunk[p + 1];
    bool has_target = false;
    for (const auto& [key, v] : e.items()) {
      TokenLogprob t;
      if (!token_key(key, t.token)) throw_format(url, where + ": key '" + key + "' is not a token id");
      const json* lp = v.is_object() && v.contains("logprob") ? &v["logprob"] : (v.is_number() ? &v : nullptr);
      if (!lp || !lp->is_number()) throw_format(url, where + "['" + key + "'] has no numeric 'logprob'");
      const double value = lp->get<double>();
      t.logprob = static_cast<float>(value);
      if (t.token == pos.target) {
        pos.target_logprob = value;
        has_target = true;
      }
      pos.sparse.push_back(t);
    }
    if (!has_target) throw_format(url, where + " lacks the prompt token " + std::to_string(pos.target) + " (vLLM always includes it)");
    std::sort(pos.sparse.begin(), pos.sparse.end(), [](const TokenLogprob& a, const TokenLogprob& b) { return a.token < b.token; });
    out.push_back(std::move(pos));
  }
  return out;
}

std::unique_ptr<ChunkScorer> make_server_scorer(const ServerEndpoint& server, int32_t vocab) {
  if (server.top_logprobs < 1) {
    throw_usage("prompt_logprobs K must be at least 1 (top-1 agreement and KL need the most likely token), got " +
                std::to_string(server.top_logprobs));
  }
  return std::make_unique<ServerScorer>(server, vocab);
}

}  // namespace servetune::loadgen
