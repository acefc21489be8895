// Response and SSE chunk rendering (see openai_response.h).
#include "server/openai_response.h"

#include <algorithm>
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

Usage combined_usage(const std::vector<Usage>& choices) {
  Usage total;
  if (choices.empty()) return total;
  total.prompt_tokens = choices.front().prompt_tokens;
  total.cached_tokens = choices.front().cached_tokens;
  for (const Usage& u : choices) {
    total.completion_tokens += u.completion_tokens;
    total.spec_num_drafts += u.spec_num_drafts;
    total.spec_draft_tokens += u.spec_draft_tokens;
    total.spec_accepted_tokens += u.spec_accepted_tokens;
  }
  return total;
}

ResponseBuilder::ResponseBuilder(const GenerateRequest& request, std::string id, int64_t created, const std::string& model,
                                 const Tokenizer& tokenizer)
    : kind_(request.kind),
      logprobs_(request.logprobs),
      tokens_as_ids_(request.tokens_as_ids),
      include_usage_(request.include_usage),
      continuous_usage_(request.continuous_usage),
      id_(std::move(id)),
      tokenizer_(tokenizer),
      choices_(static_cast<size_t>(std::max(request.n, 1))) {
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

namespace {
std::string token_id_name(int32_t token) { return "token_id:" + std::to_string(token); }
}  // namespace

std::string ResponseBuilder::logprob_token(int32_t token) const {
  return tokens_as_ids_ ? token_id_name(token) : piece(token);
}

void ResponseBuilder::append_chat_logprob_entry(std::string& out, int32_t token, float logprob) const {
  const std::string p = logprob_token(token);
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
    append_json_string(tokens, tokens_as_ids_ ? token_id_name(lps[i].token) : p);
    token_logprobs += sep;
    append_json_number(token_logprobs, lps[i].logprob);
    offsets += sep + std::to_string(text_offset);  // offsets index the returned text, whatever names the tokens
    text_offset += p.size();
    // A dict: the sampled token plus the top-n, each key once (as vLLM).
    top += sep;
    top += '{';
    std::unordered_set<std::string> seen;
    auto add = [&](int32_t t, float lp) {
      std::string key;
      append_json_string(key, logprob_token(t));
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

std::string ResponseBuilder::chunk(int choice, const std::string& text, const std::vector<SampleResult>& logprobs,
                                   const char* finish, const Usage* usage) {
  std::string out = "data: ";
  out += prefix_;
  out += "[{\"index\":" + std::to_string(choice) + ',';
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
    size_t& offset = choices_[static_cast<size_t>(choice)].text_offset;
    append_logprobs(out, logprobs, offset);
    for (const auto& lp : logprobs) offset += piece(lp.token).size();
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
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    out += "data: ";
    out += prefix_;
    out += "[{\"index\":" + std::to_string(i) +
           ",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]";
    if (include_usage_) out += ",\"usage\":null";
    out += "}\n\n";
  }
  return out;
}

std::string ResponseBuilder::stream_event(int choice, const TokenEvent& e) {
  const char* finish = finish_reason_text(e.finish);
  const Usage* usage = continuous_usage_ ? &e.usage : nullptr;
  if (!finish && e.text.empty() && !(logprobs_ && !e.logprobs.empty())) return {};
  return chunk(choice, e.text, e.logprobs, finish, usage);
}

std::string ResponseBuilder::stream_usage(const Usage& total) const {
  if (!include_usage_) return {};
  return "data: " + prefix_ + "[],\"usage\":" + usage_json(total) + "}\n\n";
}

std::string ResponseBuilder::stream_error(const std::string& message, int status) {
  std::string out = "data: {\"error\":{\"message\":";
  append_json_string(out, message);
  out += ",\"type\":\"server_error\",\"param\":null,\"code\":" + std::to_string(status) + "}}\n\n";
  return out;
}

void ResponseBuilder::add(int choice, const TokenEvent& e) {
  Choice& c = choices_[static_cast<size_t>(choice)];
  c.text += e.text;
  if (logprobs_) c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
}

std::string ResponseBuilder::response(const std::vector<FinishReason>& finish, const Usage& total,
                                      const std::string* prompt_logprobs) const {
  std::string out = prefix_;
  out += '[';
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    if (i) out += ',';
    out += "{\"index\":" + std::to_string(i) + ',';
    if (kind_ == ApiKind::kChat) {
      out += "\"message\":{\"role\":\"assistant\",\"content\":";
      append_json_string(out, c.text);
      out += ",\"refusal\":null}";
    } else {
      out += "\"text\":";
      append_json_string(out, c.text);
    }
    out += ",\"logprobs\":";
    if (logprobs_) {
      append_logprobs(out, c.logprobs, 0);
    } else {
      out += "null";
    }
    out += ",\"finish_reason\":";
    const char* reason = i < finish.size() ? finish_reason_text(finish[i]) : nullptr;
    append_json_string(out, reason ? reason : "stop");
    if (prompt_logprobs) out += ",\"prompt_logprobs\":" + *prompt_logprobs;
    out += '}';
  }
  out += "],\"usage\":" + usage_json(total) + "}";
  return out;
}

}  // namespace servetune::server
