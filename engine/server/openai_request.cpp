// Request-body parsing and validation for the OpenAI / vLLM routes (see openai_request.h).
#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "servetune/error.h"

namespace servetune::server {
namespace {

using nlohmann::json;

constexpr int64_t kMaxLogprobs = 20;
constexpr size_t kMaxStopStrings = 64;
constexpr int64_t kMaxChoices = 128;  // 'n': each choice is an engine request; the server's capacity limit also applies

const char* type_name(const json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

[[noreturn]] void bad_type(const std::string& name, const char* want, const json& got) {
  throw_bad_request("'" + name + "' must be " + want + ", got " + type_name(got), name);
}

json parse_object(std::string_view body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error for bad syntax, out_of_range for a number beyond a double ("1e400"): both the client's input.
    throw_bad_request(std::string("request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw_bad_request(std::string("request body must be a JSON object, got ") + type_name(j));
  return j;
}

// Field access where null means absent, as the OpenAI clients send it.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}

  const json* find(const std::string& name) const {
    auto it = j_.find(name);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<bool> boolean(const std::string& name) const {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad_type(name, "a boolean", *v);
    return v->get<bool>();
  }
  std::optional<double> number(const std::string& name) const {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad_type(name, "a number", *v);
    return v->get<double>();
  }
  // Integers; a float with no fractional part is accepted (as pydantic does).
  std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) const {
    const json* v = find(name);
    if (!v) return std::nullopt;
    int64_t out = 0;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        out = std::numeric_limits<int64_t>::max();
      } else {
        out = v->get<int64_t>();
      }
    } else if (v->is_number_float()) {
      const double d = v->get<double>();
      if (!(std::floor(d) == d) || std::fabs(d) > 9.0e18) bad_type(name, "an integer", *v);
      out = static_cast<int64_t>(d);
    } else {
      bad_type(name, "an integer", *v);
    }
    if (out < lo || out > hi) {
      throw_bad_request("'" + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                            std::to_string(out),
                        name);
    }
    return out;
  }
  std::optional<std::string> string(const std::string& name) const {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad_type(name, "a string", *v);
    return v->get<std::string>();
  }

 private:
  const json& j_;
};

float to_float(double v) { return static_cast<float>(v); }

std::vector<int32_t> token_ids(const json& arr, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const auto& t : arr) {
    if (!t.is_number_integer()) throw_bad_request("'" + name + "' must be a list of integer token ids", name);
    const int64_t id = t.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(), uint64_t{1} << 40))
                                              : t.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      throw_bad_request("token id " + std::to_string(id) + " in '" + name + "' is out of range", name);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// Rejects a field set to anything but its no-op value.
void reject_if(bool set, const std::string& name, const std::string& why) {
  if (set) throw_bad_request("'" + name + "' " + why, name);
}

// Sampling fields shared by both routes.
void parse_sampling(const Fields& f, GenerateRequest& r) {
  SamplingParams& s = r.sampling;
  if (auto v = f.number("temperature")) s.temperature = to_float(*v);
  if (auto v = f.number("top_p")) s.top_p = to_float(*v);
  if (auto v = f.integer("top_k", -1, std::numeric_limits<int32_t>::max())) s.top_k = static_cast<int32_t>(*v);
  if (auto v = f.number("min_p")) s.min_p = to_float(*v);
  if (auto v = f.number("presence_penalty")) s.presence_penalty = to_float(*v);
  if (auto v = f.number("frequency_penalty")) s.frequency_penalty = to_float(*v);
  if (auto v = f.number("repetition_penalty")) s.repetition_penalty = to_float(*v);
  if (const json* v = f.find("seed")) {
    if (v->is_number_unsigned()) {
      s.seed = v->get<uint64_t>();
    } else {
      s.seed = static_cast<uint64_t>(*f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    }
  }
  if (auto v = f.boolean("ignore_eos")) s.ignore_eos = *v;
  // Exact ids for clients that need them (a token's text alone can be ambiguous or not valid UTF-8).
  if (auto v = f.boolean("return_tokens_as_token_ids")) r.tokens_as_ids = *v;
  if (auto v = f.integer("min_tokens", 0, std::numeric_limits<int32_t>::max())) s.min_tokens = static_cast<int32_t>(*v);
  // max_completion_tokens wins over the deprecated max_tokens, as in vLLM.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (auto v = f.integer(name, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
      if (*v < 1) throw_bad_request(std::string("'") + name + "' must be at least 1, got " + std::to_string(*v), name);
      s.max_tokens = static_cast<int32_t>(std::min<int64_t>(*v, std::numeric_limits<int32_t>::max()));
      r.max_tokens_given = true;
    }
  }
  if (const json* v = f.find("stop")) {
    if (v->is_string()) {
      s.stop = {v->get<std::string>()};
    } else if (v->is_array()) {
      if (v->size() > kMaxStopStrings) throw_bad_request("'stop' has more than " + std::to_string(kMaxStopStrings) + " strings", "stop");
      for (const auto& x : *v) {
        if (!x.is_string()) throw_bad_request("'stop' must be a string or a list of strings", "stop");
        s.stop.push_back(x.get<std::string>());
      }
    } else {
      bad_type("stop", "a string or a list of strings", *v);
    }
  }
  if (const json* v = f.find("stop_token_ids")) {
    if (!v->is_array()) bad_type("stop_token_ids", "a list of integers", *v);
    s.stop_token_ids = token_ids(*v, "stop_token_ids");
  }
  if (auto v = f.boolean("stream")) r.stream = *v;
  if (const json* so = f.find("stream_options")) {
    if (!so->is_object()) bad_type("stream_options", "an object", *so);
    if (!r.stream) throw_bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    Fields o(*so);
    if (auto v = o.boolean("include_usage")) r.include_usage = *v;
    if (auto v = o.boolean("continuous_usage_stats")) r.continuous_usage = *v;
  }
  if (auto v = f.integer("n", 1, kMaxChoices)) r.n = static_cast<int32_t>(*v);
  // vLLM's V1 engine rejects best_of > n (it would need n of best_of samples ranked by cumulative logprob); so do we.
  if (auto v = f.integer("best_of", 1, std::numeric_limits<int64_t>::max()); v && *v != r.n) {
    throw_bad_request("'best_of' must equal 'n' (" + std::to_string(r.n) + "), got " + std::to_string(*v) +
                          ": choosing the best of more samples than are returned is not supported",
                      "best_of");
  }
  if (const json* v = f.find("logit_bias")) {
    if (!v->is_object()) bad_type("logit_bias", "an object", *v);
    reject_if(!v->empty(), "logit_bias", "is not supported");
  }
  if (auto v = f.boolean("echo")) {
    reject_if(*v, "echo", "is not supported; for the prompt's log-probabilities send vLLM's 'prompt_logprobs' (/v1/completions)");
  }
  if (auto v = f.boolean("skip_special_tokens")) reject_if(!*v, "skip_special_tokens", "must be true: special tokens are always skipped");
  if (auto v = f.boolean("include_stop_str_in_output")) reject_if(*v, "include_stop_str_in_output", "is not supported");
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                           "structured_outputs", "bad_words", "allowed_token_ids", "logits_processors"}) {
    reject_if(f.find(name) != nullptr, name, "is not supported");
  }
}

// Converts the engine's sampling validation into a 400 naming the field its message starts with. Without an
// explicit max_tokens, chat's limit is the rest of the context, checked once the prompt is tokenized.
void validate_sampling(const GenerateRequest& r) {
  SamplingParams s = r.sampling;
  if (r.kind == ApiKind::kChat && !r.max_tokens_given) s.max_tokens = std::numeric_limits<int32_t>::max();
  try {
    validate_sampling_params(s);
  } catch (const Error& e) {
    const std::string msg = e.what();
    throw_bad_request(msg, msg.substr(0, msg.find(' ')));
  }
}

std::vector<ChatMessage> parse_messages(const json* v) {
  if (!v) throw_bad_request("'messages' is required", "messages");
  if (!v->is_array()) bad_type("messages", "a list", *v);
  if (v->empty()) throw_bad_request("'messages' must not be empty", "messages");
  std::vector<ChatMessage> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_type(where, "an object", m);
    Fields f(m);
    auto role = f.string("role");
    if (!role) throw_bad_request("'" + where + ".role' is required", "messages");
    if (*role == "developer") role = "system";
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool") {
      throw_bad_request("'" + where + ".role' must be system, developer, user, assistant or tool, got '" + *role + "'", "messages");
    }
    if (f.find("tool_calls") || f.find("function_call")) throw_bad_request("'" + where + "': tool calls are not supported", "messages");
    ChatMessage msg{*role, {}};
    if (const json* c = f.find("content")) {
      if (c->is_string()) {
        msg.content = c->get<std::string>();
      } else if (c->is_array()) {
        for (const auto& part : *c) {
          if (!part.is_object()) bad_type(where + ".content[]", "an object", part);
          Fields p(part);
          const auto type = p.string("type");
          if (type != "text") {
            throw_bad_request("'" + where + "': content type '" + type.value_or("") + "' is not supported (only text)", "messages");
          }
          const auto text = p.string("text");
          if (!text) throw_bad_request("'" + where + "': a text part needs 'text'", "messages");
          msg.content += *text;
        }
      } else {
        bad_type(where + ".content", "a string or a list of content parts", *c);
      }
    } else if (*role != "assistant") {
      throw_bad_request("'" + where + ".content' is required", "messages");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::string model_field(const Fields& f) { return f.string("model").value_or(""); }

}  // namespace

GenerateRequest parse_completion_request(std::string_view body) {
  const json j = parse_object(body);
  Fields f(j);
  GenerateRequest r;
  r.kind = ApiKind::kCompletion;
  r.model = model_field(f);
  r.sampling.max_tokens = 16;  // OpenAI's and vLLM's default for completions
  const json* p = f.find("prompt");
  if (!p) throw_bad_request("'prompt' is required", "prompt");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) throw_bad_request("'prompt' must not be empty", "prompt");
    const json& first = p->front();
    if (first.is_number_integer()) {
      r.prompt_ids = token_ids(*p, "prompt");
    } else if (first.is_string() || first.is_array()) {
      if (p->size() != 1) {
        throw_bad_request("batched prompts are not supported: send one prompt per request (got " + std::to_string(p->size()) + ")",
                          "prompt");
      }
      if (first.is_string()) {
        r.prompt_text = first.get<std::string>();
      } else {
        if (first.empty()) throw_bad_request("'prompt' must not be empty", "prompt");
        r.prompt_ids = token_ids(first, "prompt");
      }
    } else {
      bad_type("prompt", "a string, a list of token ids, or a list of one string", *p);
    }
  } else {
    bad_type("prompt", "a string, a list of token ids, or a list of one string", *p);
  }
  parse_sampling(f, r);
  if (auto v = f.integer("logprobs", 0, kMaxLogprobs)) {
    r.logprobs = true;
    r.sampling.logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = f.integer("prompt_logprobs", 0, kMaxLogprobs)) {
    reject_if(r.stream, "prompt_logprobs", "is not available when 'stream' is true (as in vLLM)");
    r.prompt_logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = f.string("suffix")) reject_if(!v->empty(), "suffix", "is not supported");
  if (auto v = f.boolean("add_special_tokens")) r.add_special_tokens = *v;
  validate_sampling(r);
  return r;
}

GenerateRequest parse_chat_request(std::string_view body) {
  const json j = parse_object(body);
  Fields f(j);
  GenerateRequest r;
  r.kind = ApiKind::kChat;
  r.model = model_field(f);
  r.add_special_tokens = false;
  r.messages = parse_messages(f.find("messages"));
  parse_sampling(f, r);
  if (auto v = f.boolean("logprobs")) r.logprobs = *v;
  if (auto v = f.integer("top_logprobs", 0, kMaxLogprobs)) {
    if (!r.logprobs) throw_bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    r.sampling.logprobs = static_cast<int32_t>(*v);
  } else if (r.logprobs) {
    r.sampling.logprobs = 0;
  }
  if (auto v = f.boolean("add_generation_prompt")) r.add_generation_prompt = *v;
  if (auto v = f.boolean("add_special_tokens")) r.add_special_tokens = *v;
  if (auto v = f.boolean("continue_final_message")) reject_if(*v, "continue_final_message", "is not supported");
  if (const json* v = f.find("response_format")) {
    if (!v->is_object()) bad_type("response_format", "an object", *v);
    const auto type = Fields(*v).string("type");
    reject_if(type != "text", "response_format", "only {\"type\": \"text\"} is supported");
  }
  if (const json* tools = f.find("tools")) {
    if (!tools->is_array()) bad_type("tools", "a list", *tools);
    const json* choice = f.find("tool_choice");
    const bool none = choice && choice->is_string() && choice->get<std::string>() == "none";
    reject_if(!tools->empty() && !none, "tools", "are not supported (tool calling is not implemented)");
  } else if (const json* choice = f.find("tool_choice")) {
    reject_if(!(choice->is_string() && (*choice == "none" || *choice == "auto")), "tool_choice", "needs 'tools'");
  }
  for (const char* name : {"functions", "function_call", "audio", "prediction", "chat_template", "documents"}) {
    reject_if(f.find(name) != nullptr, name, "is not supported");
  }
  reject_if(f.find("prompt_logprobs") != nullptr, "prompt_logprobs", "is supported on /v1/completions only");
  if (const json* v = f.find("modalities")) {
    reject_if(*v != json::array({"text"}), "modalities", "only [\"text\"] is supported");
  }
  validate_sampling(r);
  return r;
}

TokenizeRequest parse_tokenize_request(std::string_view body) {
  const json j = parse_object(body);
  Fields f(j);
  TokenizeRequest r;
  r.model = model_field(f);
  const json* prompt = f.find("prompt");
  const json* messages = f.find("messages");
  if ((prompt != nullptr) == (messages != nullptr)) throw_bad_request("give exactly one of 'prompt' or 'messages'");
  if (prompt) {
    r.prompt = f.string("prompt");
  } else {
    r.messages = parse_messages(messages);
    r.add_special_tokens = false;
  }
  if (auto v = f.boolean("add_special_tokens")) r.add_special_tokens = *v;
  if (auto v = f.boolean("add_generation_prompt")) r.add_generation_prompt = *v;
  if (auto v = f.boolean("return_token_strs")) r.return_token_strs = *v;
  if (auto v = f.boolean("continue_final_message")) reject_if(*v, "continue_final_message", "is not supported");
  for (const char* name : {"tools", "chat_template"}) reject_if(f.find(name) != nullptr, name, "is not supported");
  return r;
}

DetokenizeRequest parse_detokenize_request(std::string_view body) {
  const json j = parse_object(body);
  Fields f(j);
  DetokenizeRequest r;
  r.model = model_field(f);
  const json* tokens = f.find("tokens");
  if (!tokens) throw_bad_request("'tokens' is required", "tokens");
  if (!tokens->is_array()) bad_type("tokens", "a list of integers", *tokens);
  r.tokens = token_ids(*tokens, "tokens");
  return r;
}

bool bearer_matches(std::string_view header_value, std::string_view key) {
  constexpr std::string_view kPrefix = "Bearer ";
  std::string_view given;
  if (header_value.size() >= kPrefix.size() && header_value.substr(0, kPrefix.size()) == kPrefix) {
    given = header_value.substr(kPrefix.size());
  }
  // Touch exactly key.size() bytes whatever `given` is, and fold the size difference in.
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0u;
    diff |= g ^ static_cast<unsigned char>(key[i]);
  }
  return diff == 0 && !key.empty();
}

}  // namespace servetune::server
