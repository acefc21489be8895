// Chat templates without a Jinja engine: the template text is recognised by fingerprints of the common
// families (ChatML, Llama-2, Llama-3 / 3.1) and rendered by hand exactly as Jinja would render it, including
// a default system prompt the template injects (SmolLM2, Qwen2.5) and Llama-3.1's dated system header.
#include <algorithm>
#include <optional>
#include <utility>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace servetune {
namespace {

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// Concatenation by appends (operator+ chains trip a GCC 12 -Wrestrict false positive).
std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

// Python's str.strip() (Jinja's trim and .strip()): removes Unicode whitespace at both ends.
bool py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}
std::string py_strip(std::string_view s) {
  size_t b = 0, e = s.size(), len = 0;
  while (b < e && py_space(unicode::decode_lenient(s, b, len))) b += len;
  while (e > b) {
    size_t start = e - 1;
    while (start > b && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    if (!py_space(unicode::decode_lenient(s, start, len)) || start + len != e) break;
    e = start;
  }
  return std::string(s.substr(b, e - b));
}

// Template text with Jinja string escapes resolved, spaces dropped and the common spellings unified, so
// fingerprints survive formatting differences.
std::string normalise(std::string_view t) {
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    if (c == '\\' && i + 1 < t.size() && t[i + 1] == 'n') {
      out.push_back('\n');
      ++i;
    } else if (c == '"') {
      out.push_back('\'');
    } else if (c != ' ' && c != '-') {
      out.push_back(c);
    }
  }
  for (auto [from, to] : {std::pair<std::string_view, std::string_view>{"message.role", "message['role']"},
                          {"message.content", "message['content']"}}) {
    for (size_t p = out.find(from); p != std::string::npos; p = out.find(from, p + to.size())) out.replace(p, from.size(), to);
  }
  return out;
}

// Contents of the Jinja string literal starting at t[q] (a quote), escapes resolved.
std::string read_literal(std::string_view t, size_t q) {
  std::string out;
  const char quote = t[q];
  for (size_t i = q + 1; i < t.size() && t[i] != quote; ++i) {
    if (t[i] == '\\' && i + 1 < t.size()) {
      char e = t[++i];
      out.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
    } else {
      out.push_back(t[i]);
    }
  }
  return out;
}

// The default system prompt of a ChatML template: a literal '<|im_start|>system\n...<|im_end|>' that is a
// whole string literal (not concatenated with the message content).
std::optional<std::string> default_system_prompt(std::string_view t) {
  const std::string_view head = "<|im_start|>system";
  for (size_t p = t.find(head); p != std::string_view::npos; p = t.find(head, p + 1)) {
    if (p == 0 || (t[p - 1] != '\'' && t[p - 1] != '"')) continue;
    std::string lit = read_literal(t, p - 1);
    const std::string prefix = "<|im_start|>system\n", suffix = "<|im_end|>\n";
    if (lit.size() >= prefix.size() + suffix.size() && lit.compare(0, prefix.size(), prefix) == 0 &&
        lit.compare(lit.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return lit.substr(prefix.size(), lit.size() - prefix.size() - suffix.size());
    }
  }
  return std::nullopt;
}

std::string render_chatml(std::string_view t, const std::vector<ChatMessage>& msgs, bool gen) {
  std::string out;
  auto emit = [&](const std::string& role, const std::string& content) {
    out += cat({"<|im_start|>", role, "\n", content, "<|im_end|>\n"});
  };
  if (auto sys = default_system_prompt(t)) {
    // SmolLM2 injects it inside the loop (loop.first), Qwen2.5 before the loop (also with no messages).
    const bool in_loop = contains(t, "loop.first");
    if ((msgs.empty() && !in_loop) || (!msgs.empty() && msgs.front().role != "system")) emit("system", *sys);
  }
  for (const ChatMessage& m : msgs) emit(m.role, m.content);
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_llama2(const std::vector<ChatMessage>& msgs, std::string_view bos, std::string_view eos) {
  size_t first = 0;
  std::optional<std::string> system;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    first = 1;
  }
  std::string out;
  for (size_t i = first; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if ((m.role == "user") != ((i - first) % 2 == 0)) {
      throw_usage("chat template (llama2): conversation roles must alternate user/assistant/user/assistant/...");
    }
    std::string content = m.content;
    if (i == first && system) content = cat({"<<SYS>>\n", *system, "\n<</SYS>>\n\n", m.content});
    if (m.role == "user") {
      out += cat({bos, "[INST] ", py_strip(content), " [/INST]"});
    } else if (m.role == "assistant") {
      out += cat({" ", py_strip(content), " ", eos});
    }
  }
  return out;
}

std::string render_llama3(std::string_view t, const std::vector<ChatMessage>& msgs, bool gen, std::string_view bos) {
  auto turn = [](const std::string& role, const std::string& content) {
    return cat({"<|start_header_id|>", role, "<|end_header_id|>\n\n", py_strip(content), "<|eot_id|>"});
  };
  std::string out;
  if (contains(t, "Cutting Knowledge Date")) {
    // Llama-3.1 style: BOS, then a system header with the knowledge/today dates and the system message.
    std::string date = "26 Jul 2024";
    if (size_t p = t.find("set date_string = "); p != std::string_view::npos) {
      date = read_literal(t, p + std::string_view("set date_string = ").size());
    }
    size_t first = 0;
    std::string system;
    if (!msgs.empty() && msgs[0].role == "system") {
      system = py_strip(msgs[0].content);
      first = 1;
    }
    out += cat({bos, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"});
    out += cat({"Today Date: ", date, "\n\n", system, "<|eot_id|>"});
    for (size_t i = first; i < msgs.size(); ++i) out += turn(msgs[i].role, msgs[i].content);
  } else {
    for (size_t i = 0; i < msgs.size(); ++i) out += cat({i == 0 ? bos : std::string_view(), turn(msgs[i].role, msgs[i].content)});
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace

std::string detect_chat_template(std::string_view t) {
  if (t == "chatml" || t == "llama2" || t == "llama3") return std::string(t);
  const std::string n = normalise(t);
  if (contains(t, "<|im_start|>")) {
    if (contains(t, "<|im_sep|>") || contains(t, "<end_of_utterance>")) return "";
    const bool turn = contains(n, "'<|im_start|>'+message['role']+'\n'+message['content']+'<|im_end|>'") ||
                      contains(n, "'<|im_start|>'+message['role']+'\n'+message['content']+'<|im_end|>\n'");
    return turn ? "chatml" : "";
  }
  if (contains(t, "<|start_header_id|>") && contains(t, "<|end_header_id|>")) {
    const bool turn = contains(n, "'<|start_header_id|>'+message['role']+'<|end_header_id|>\n\n'+message['content']|trim+'<|eot_id|>'");
    const bool tools = contains(t, "tool") && !contains(t, "Cutting Knowledge Date");
    return turn && !tools ? "llama3" : "";
  }
  if (contains(t, "[INST]") && contains(t, "<<SYS>>") && contains(n, "bos_token+'[INST]'+content.strip()+'[/INST]'") &&
      contains(n, "'<<SYS>>\n'+system_message+'\n<</SYS>>\n\n'") && !contains(t, "[SYSTEM_PROMPT]")) {
    return "llama2";
  }
  return "";
}

std::string apply_chat_template(std::string_view template_text, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::string_view bos_text, std::string_view eos_text) {
  if (template_text.empty()) throw_unsupported("the model has no chat template (tokenizer.chat_template is empty)");
  const std::string family = detect_chat_template(template_text);
  if (messages.empty() && !family.empty()) {
    // Jinja fails on messages[0] when the template reads it before (outside) its message loop.
    const size_t first_index = template_text.find("messages[0]");
    const size_t first_loop = std::min(template_text.find("{% for"), template_text.find("{%- for"));
    if (first_index != std::string_view::npos && first_index < first_loop) {
      throw_usage("chat template (" + family + ") needs at least one message (it reads messages[0])");
    }
  }
  if (family == "chatml") return render_chatml(template_text, messages, add_generation_prompt);
  if (family == "llama3") return render_llama3(template_text, messages, add_generation_prompt, bos_text);
  if (family == "llama2") return render_llama2(messages, bos_text, eos_text);
  std::string head(template_text.substr(0, 80));
  std::replace(head.begin(), head.end(), '\n', ' ');
  throw_unsupported(cat({"chat template not recognised (supported: ChatML, Llama-2, Llama-3 families; no Jinja engine): \"",
                         head, template_text.size() > 80 ? "...\"" : "\""}));
}

std::string apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  if (tokenizer.chat_template().empty()) {
    throw_unsupported(tokenizer.source() + ": the model has no chat template");
  }
  auto text_of = [&](int32_t id) { return id >= 0 ? tokenizer.token_text(id) : std::string(); };
  try {
    return apply_chat_template(tokenizer.chat_template(), messages, add_generation_prompt, text_of(tokenizer.bos_id()),
                               text_of(tokenizer.eos_id()));
  } catch (const Error& e) {
    throw Error(e.kind(), cat({tokenizer.source(), ": ", e.what()}));
  }
}

}  // namespace servetune
