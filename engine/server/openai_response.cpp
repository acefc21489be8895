// Response and SSE chunk rendering (see openai_response.h).
#include "server/openai_response.h"

#include <unordered_set>

#include "server/api_error.h"
#include "server/json_text.h"
#include "servetune/tokenizer.h"

namespace servetune::server {

const char* finish_reason_text(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return nullptr;
}

std::string usage_json(const Usage& u) {
  std::string out = "{\"prompt_tokens\":" + std::to_string(u.prompt_tokens) +
                    ",\"completion_tokens\":" + std::to_string(u.completion_tokens) +
                    ",\"total_tokens\":" + std::to_string(u.prompt_tokens + u.completion_tokens) +
                    ",\"prompt_tokens_details\":{\"cached_tokens\":" + std::to_string(u.cached_tokens) + "}}";
  return out;
}

ResponseBuilder::ResponseBuilder(const GenerateRequest& request, std::string id, int64_t created, const std::string& model,
                                 const Tokenizer& tokenizer)
    : kind_(request.kind),
      logprobs_(request.logprobs),
      include_usage_(request.include_usage),
      continuous_usage_(request.continuous_usage),
      id_(std::move(id)),
      tokenizer_(tokenizer) {
  prefix_ = "{\"id\":";
  append_json_string(prefix_, id_);
  prefix_ += ",\"object\":";
  prefix_ += kind_ == ApiKind::kChat ? (request.stream ? "\"chat.completion.chunk\"" : "\"chat.completion\"") : "\"text_completion\"";
  prefix_ += ",\"created\":" + std::to_string(created) + ",\"model\":";
  append_json_string(prefix_, model);
  prefix_ += ",\"choices\":";
}

std::string ResponseBuilder::piece(int32_t token) const {
  if (token < 0 || token >= tokenizer_.vocab_size()) return {};
  return tokenizer_.token_to_piece(token);
}

void ResponseBuilder::append_chat_logprob_entry(std::string& out, int32_t token, float logprob) const {
  const std::string p = piece(token);
  out += "{\"token\":";
  append_json_string(out, p);
  out += ",\"logprob\":";
  append_json_number(out, logprob);
  out += ",\"bytes\":[";
  for (size_t i = 0; i < p.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(static_cast<unsigned char>(p[i]));
  }
  out += "]";
}

void ResponseBuilder::append_logprobs(std::string& out, const std::vector<SampleResult>& lps, size_t text_offset) const {
  if (kind_ == ApiKind::kChat) {
    out += "{\"content\":[";
    for (size_t i = 0; i < lps.size(); ++i) {
      if (i) out += ',';
      append_chat_logprob_entry(out, lps[i].token, lps[i].logprob);
      out += ",\"top_logprobs\":[";
      for (size_t k = 0; k < lps[i].top.size(); ++k) {
        if (k) out += ',';
        append_chat_logprob_entry(out, lps[i].top[k].token, lps[i].top[k].logprob);
        out += '}';
      }
      out += "]}";
    }
    out += "],\"refusal\":null}";
    return;
  }
  std::string tokens = "[", token_logprobs = "[", top = "[", offsets = "[";
  for (size_t i = 0; i < lps.size(); ++i) {
    const char* sep = i ? "," : "";
    const std::string p = piece(lps[i].token);
    tokens += sep;
    append_json_string(tokens, p);
    token_logprobs += sep;
    append_json_number(token_logprobs, lps[i].logprob);
    offsets += sep + std::to_string(text_offset);
    text_offset += p.size();
    // A dict: the sampled token plus the top-n, each key once (as vLLM).
    top += sep;
    top += '{';
    std::unordered_set<std::string> seen;
    auto add = [&](int32_t t, float lp) {
      std::string key;
      append_json_string(key, piece(t));
      if (!seen.insert(key).second) return;
      if (seen.size() > 1) top += ',';
      top += key + ':';
      append_json_number(top, lp);
    };
    add(lps[i].token, lps[i].logprob);
    for (const auto& t : lps[i].top) add(t.token, t.logprob);
    top += '}';
  }
  out += "{\"text_offset\":" + offsets + "],\"token_logprobs\":" + token_logprobs + "],\"tokens\":" + tokens +
         "],\"top_logprobs\":" + top + "]}";
}

std::string ResponseBuilder::chunk(const std::string& text, const std::vector<SampleResult>& logprobs, const char* finish,
                                   const Usage* usage) {
  std::string out = "data: ";
  out += prefix_;
  out += "[{\"index\":0,";
  if (kind_ == ApiKind::kChat) {
    out += "\"delta\":{";
    if (!text.empty()) {
      out += "\"content\":";
      append_json_string(out, text);
    }
    out += '}';
  } else {
    out += "\"text\":";
    append_json_string(out, text);
  }
  out += ",\"logprobs\":";
  if (logprobs_ && !logprobs.empty()) {
    append_logprobs(out, logprobs, text_offset_);
    for (const auto& lp : logprobs) text_offset_ += piece(lp.token).size();
  } else {
    out += "null";
  }
  out += ",\"finish_reason\":";
  if (finish) {
    append_json_string(out, finish);
  } else {
    out += "null";
  }
  out += "}]";
  if (usage) {
    out += ",\"usage\":" + usage_json(*usage);
  } else if (include_usage_) {
    out += ",\"usage\":null";
  }
  out += "}\n\n";
  return out;
}

std::string ResponseBuilder::stream_start() const {
  if (kind_ != ApiKind::kChat) return {};
  std::string out = "data: ";
  out += prefix_;
  out += "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]";
  if (include_usage_) out += ",\"usage\":null";
  out += "}\n\n";
  return out;
}

std::string ResponseBuilder::stream_event(const TokenEvent& e) {
  const char* finish = finish_reason_text(e.finish);
  const Usage* usage = continuous_usage_ ? &e.usage : nullptr;
  std::string out;
  if (finish || !e.text.empty() || (logprobs_ && !e.logprobs.empty())) out = chunk(e.text, e.logprobs, finish, usage);
  if (finish && include_usage_) {
    out += "data: ";
    out += prefix_;
    out += "[],\"usage\":" + usage_json(e.usage) + "}\n\n";
  }
  return out;
}

std::string ResponseBuilder::stream_error(const std::string& message, int status) {
  std::string out = "data: {\"error\":{\"message\":";
  append_json_string(out, message);
  out += ",\"type\":\"server_error\",\"param\":null,\"code\":" + std::to_string(status) + "}}\n\n";
  return out;
}

void ResponseBuilder::add(const TokenEvent& e) {
  text_ += e.text;
  if (logprobs_) all_logprobs_.insert(all_logprobs_.end(), e.logprobs.begin(), e.logprobs.end());
}

std::string ResponseBuilder::response(const TokenEvent& final_event) const {
  std::string out = prefix_;
  out += "[{\"index\":0,";
  if (kind_ == ApiKind::kChat) {
    out += "\"message\":{\"role\":\"assistant\",\"content\":";
    append_json_string(out, text_);
    out += ",\"refusal\":null}";
  } else {
    out += "\"text\":";
    append_json_string(out, text_);
  }
  out += ",\"logprobs\":";
  if (logprobs_) {
    append_logprobs(out, all_logprobs_, 0);
  } else {
    out += "null";
  }
  out += ",\"finish_reason\":";
  const char* finish = finish_reason_text(final_event.finish);
  append_json_string(out, finish ? finish : "stop");
  out += "}],\"usage\":" + usage_json(final_event.usage) + "}";
  return out;
}

}  // namespace servetune::server
