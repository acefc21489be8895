// TokenizerImpl set-up shared by the loaders: text index, byte-token tables, end-of-generation ids and
// control-looking tokens (found by text, as llama.cpp does), special-token order and decode pieces.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace servetune::tok {
namespace {

bool is_one_of(std::string_view s, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

// Byte-level token text -> bytes; a codepoint outside the byte map is kept visible as llama.cpp does.
std::string byte_level_decode(std::string_view text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    uint32_t cp = unicode::decode_lenient(text, pos, len);
    int b = unicode::unicode_to_byte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out += "[UNK_BYTE_0x";
      for (char c : unicode::to_utf8(cp)) {
        char hex[4];
        std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
        out += hex;
      }
      out.append(text);
      out.push_back(']');
    }
    pos += len;
  }
  return out;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t p = s.find(from); p != std::string_view::npos; p = s.find(from, pos)) {
    out.append(s.substr(pos, p - pos));
    out.append(to);
    pos = p + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace

uint32_t attr_from_token_type(int64_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

void TokenizerImpl::index_texts() {
  text_to_id.reserve(texts.size());
  max_token_len = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    text_to_id.insert(texts[i], static_cast<int32_t>(i));
    max_token_len = std::max(max_token_len, texts[i].size());
  }
}

void TokenizerImpl::finalize() {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_token[b] = find(name);
  }

  // End-of-turn / FIM tokens by text; llama.cpp marks them control and (most of them) end-of-generation.
  const int32_t n = vocab_size();
  int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
  std::vector<int32_t> eog_set;
  auto mark_control = [&](int32_t id) { attrs[static_cast<size_t>(id)] |= kAttrControl; };
  for (int32_t id = 0; id < n; ++id) {
    std::string_view s = texts[static_cast<size_t>(id)];
    if (eot < 0 && is_one_of(s, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                 "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                 "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                                 "<end_of_utterance>"})) {
      eot = id;
      mark_control(id);
    }
    if (eom < 0 && s == "<|eom_id|>") {
      eom = id;
      mark_control(id);
    }
    if (fim_pad < 0 && is_one_of(s, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"})) {
      fim_pad = id;
      mark_control(id);
    }
    if (fim_rep < 0 && is_one_of(s, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"})) {
      fim_rep = id;
      mark_control(id);
    }
    if (fim_sep < 0 && s == "<|file_sep|>") {
      fim_sep = id;
      mark_control(id);
    }
    if (is_one_of(s, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                      "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                      "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                      "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["})) {
      eog_set.push_back(id);
      mark_control(id);
    }
    if (is_one_of(s, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})) {
      attrs[static_cast<size_t>(id)] = kAttrUserDefined;
    }
  }
  for (int32_t id : {fim_pad, fim_rep, fim_sep, eos, eot, eom}) {
    if (id >= 0 && id < n) eog_set.push_back(id);
  }
  for (int32_t id : extra_eog) {
    if (id >= 0 && id < n) eog_set.push_back(id);
  }
  std::sort(eog_set.begin(), eog_set.end());
  eog_set.erase(std::unique(eog_set.begin(), eog_set.end()), eog_set.end());
  // gpt-oss / solar-open: "<|end|>" ends a message, not the generation, when <|return|>/<|call|> exist.
  auto has = [&](std::string_view s) {
    return std::any_of(eog_set.begin(), eog_set.end(), [&](int32_t id) { return texts[static_cast<size_t>(id)] == s; });
  };
  if (((has("<|return|>") && has("<|call|>")) || ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>"))) &&
      has("<|end|>")) {
    int32_t end_id = find("<|end|>");
    eog_set.erase(std::remove(eog_set.begin(), eog_set.end(), end_id), eog_set.end());
    attrs[static_cast<size_t>(end_id)] = kAttrUserDefined;
  }
  if ((has("<|tool_response>") || has("<|plamo:eos|>")) && has("</s>")) {
    int32_t s_id = find("</s>");
    eog_set.erase(std::remove(eog_set.begin(), eog_set.end(), s_id), eog_set.end());
    attrs[static_cast<size_t>(s_id)] = kAttrNormal;
  }
  eog = std::move(eog_set);

  special_order.clear();
  for (int32_t id = 0; id < n; ++id) {
    if (attrs[static_cast<size_t>(id)] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) special_order.push_back(id);
  }
  std::stable_sort(special_order.begin(), special_order.end(), [&](int32_t a, int32_t b) {
    return texts[static_cast<size_t>(a)].size() > texts[static_cast<size_t>(b)].size();
  });

  pieces.assign(texts.size(), std::string());
  const bool byte_level = kind == ModelKind::kBpe && symbol_mode == SymbolMode::kByteLevel;
  for (size_t id = 0; id < texts.size(); ++id) {
    const uint32_t a = attrs[id];
    const std::string& text = texts[id];
    if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      pieces[id] = text;
    } else if (a & kAttrNormal) {
      pieces[id] = byte_level ? byte_level_decode(text) : replace_all(text, "\xE2\x96\x81", " ");
    } else if ((a & kAttrByte) && text.size() == 6 && text.compare(0, 3, "<0x") == 0) {
      pieces[id] = std::string(1, static_cast<char>(std::strtol(text.substr(3, 2).c_str(), nullptr, 16)));
    }
  }
}

}  // namespace servetune::tok
