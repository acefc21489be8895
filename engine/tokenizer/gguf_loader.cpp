// Tokenizer::from_gguf: reads tokenizer.ggml.* metadata (model, pre, tokens, scores, token_type, merges,
// special ids, add_bos/add_eos/add_space_prefix, chat template) with llama.cpp's defaults per model type; and
// Tokenizer::from_path, which picks this loader or the HF one by what the path is.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace servetune {
namespace {

using tok::PreSplit;

struct PreConfig {
  std::vector<PreSplit> splits;
  bool clean_spaces = true;
  bool ignore_merges = false;
  bool add_bos = false;
};

// llama.cpp's pre-tokenizer names, grouped by the split regexes they use.
std::optional<PreConfig> pre_config(const std::string& pre) {
  auto in = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return pre == n; });
  };
  if (in({"", "default", "gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "mellum",
          "a.x-4.0", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling"})) {
    return PreConfig{{PreSplit::kGpt2}, true, false, false};
  }
  if (in({"starcoder", "refact", "codeshell", "minerva-7b", "mellum2"})) {
    return PreConfig{{PreSplit::kDigits, PreSplit::kGpt2}, true, false, false};
  }
  if (in({"smollm", "command-r", "exaone"})) {
    return PreConfig{{PreSplit::kDigits, PreSplit::kGpt2}, pre == "exaone", false, false};
  }
  if (in({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"})) {
    return PreConfig{{PreSplit::kLlama3}, true, true, true};
  }
  if (in({"dbrx", "smaug-bpe"})) return PreConfig{{PreSplit::kLlama3}, true, false, false};
  if (in({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"})) return PreConfig{{PreSplit::kQwen2}, false, false, false};
  if (pre == "stablelm2") return PreConfig{{PreSplit::kQwen2}, true, false, false};
  return std::nullopt;
}

const GgufValue& require_array(const GgufFile& g, const char* key, GgufType elem) {
  const GgufValue* v = g.find(key);
  if (!v) throw_format(g.path(), std::string("tokenizer metadata '") + key + "' is missing");
  if (!v->is_array()) throw_format(g.path(), std::string("tokenizer metadata '") + key + "' should be an array");
  if (v->elem_type() != elem) {
    throw_format(g.path(), std::string("tokenizer metadata '") + key + "' should be an array of " +
                               std::string(gguf_type_name(elem)) + ", found " +
                               std::string(gguf_type_name(v->elem_type())));
  }
  return *v;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  auto t = std::make_unique<tok::TokenizerImpl>();
  t->source = gguf.path();
  auto model = gguf.get_string("tokenizer.ggml.model");
  if (!model) throw_format(gguf.path(), "no tokenizer: metadata 'tokenizer.ggml.model' is missing");
  t->model_type = *model;
  const std::string pre = gguf.get_string("tokenizer.ggml.pre").value_or("");
  PreConfig pre_cfg;
  if (*model == "llama") {
    t->kind = tok::ModelKind::kSpm;
    t->bos = 1;
    t->eos = 2;
    t->unk = 0;
    t->add_space_prefix = true;
    t->add_bos = true;
  } else if (*model == "gpt2") {
    t->kind = tok::ModelKind::kBpe;
    t->symbol_mode = tok::SymbolMode::kByteLevel;
    auto cfg = pre_config(pre);
    if (!cfg) {
      throw_unsupported(gguf.path() + ": pre-tokenizer '" + pre +
                        "' (tokenizer.ggml.pre) is not supported; supported: default, gpt-2, smollm, starcoder, "
                        "llama3/llama-bpe, qwen2 and their aliases");
    }
    pre_cfg = *cfg;
    t->pre_splits = pre_cfg.splits;
    t->clean_spaces = pre_cfg.clean_spaces;
    t->ignore_merges = pre_cfg.ignore_merges;
    t->add_bos = pre_cfg.add_bos;
    t->bos = 11;
    t->eos = 11;
  } else {
    throw_unsupported(gguf.path() + ": tokenizer model '" + *model +
                      "' (tokenizer.ggml.model) is not supported; supported: llama (SentencePiece BPE), gpt2 "
                      "(byte-level BPE)");
  }
  if (auto v = gguf.get_bool("tokenizer.ggml.add_space_prefix")) t->add_space_prefix = *v;

  const GgufValue& tokens = require_array(gguf, "tokenizer.ggml.tokens", GgufType::kString);
  const size_t n = tokens.strings().size();
  if (n == 0) throw_format(gguf.path(), "tokenizer.ggml.tokens is empty");
  if (n > 0x7FFFFFF0u) throw_format(gguf.path(), "tokenizer.ggml.tokens has too many entries");
  t->texts.resize(n);
  for (size_t i = 0; i < n; ++i) {
    t->texts[i] = std::string(tokens.strings()[i]);
    if (t->texts[i].empty()) t->texts[i] = "[EMPTY_" + std::to_string(i) + "]";
  }
  t->scores.assign(n, 0.0f);
  if (const GgufValue* sc = gguf.find("tokenizer.ggml.scores")) {
    if (!sc->is_array() || (sc->elem_type() != GgufType::kFloat32 && sc->elem_type() != GgufType::kInt32)) {
      throw_format(gguf.path(), "tokenizer.ggml.scores should be an array of float32");
    }
    if (sc->size() < n) {
      throw_format(gguf.path(), "tokenizer.ggml.scores has " + std::to_string(sc->size()) + " entries for " +
                                    std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) t->scores[i] = static_cast<float>(sc->at(i).as_float().value_or(0.0));
  }
  t->attrs.assign(n, tok::kAttrNormal);
  if (gguf.find("tokenizer.ggml.token_type")) {
    const GgufValue& tt = require_array(gguf, "tokenizer.ggml.token_type", GgufType::kInt32);
    if (tt.size() < n) {
      throw_format(gguf.path(), "tokenizer.ggml.token_type has " + std::to_string(tt.size()) + " entries for " +
                                    std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) t->attrs[i] = tok::attr_from_token_type(tt.at(i).as_int().value_or(0));
  }
  t->index_texts();
  if (t->text_to_id.size() != n) {
    for (size_t i = 0; i < n; ++i) {
      int32_t first = t->find(t->texts[i]);
      if (first != static_cast<int32_t>(i)) {
        throw_format(gguf.path(), "tokenizer.ggml.tokens has a duplicate entry: ids " + std::to_string(first) +
                                      " and " + std::to_string(i) + " are both '" + t->texts[i] + "'");
      }
    }
  }

  if (t->kind == tok::ModelKind::kBpe) {
    const GgufValue& merges = require_array(gguf, "tokenizer.ggml.merges", GgufType::kString);
    std::vector<std::pair<std::string, std::string>> rules;
    rules.reserve(merges.strings().size());
    for (std::string_view m : merges.strings()) {
      size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
      if (sp == std::string_view::npos) {
        rules.emplace_back("", "");  // llama.cpp keeps a rank for it; it can never match
      } else {
        rules.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
      }
    }
    tok::build_merges(*t, rules, false);
  }

  auto read_id = [&](const char* key, int32_t& id) {
    if (id >= static_cast<int32_t>(n)) id = -1;
    auto v = gguf.get_int(key);
    if (v && *v >= 0 && *v < static_cast<int64_t>(n)) id = static_cast<int32_t>(*v);
  };
  read_id("tokenizer.ggml.bos_token_id", t->bos);
  read_id("tokenizer.ggml.eos_token_id", t->eos);
  read_id("tokenizer.ggml.eot_token_id", t->eot);
  read_id("tokenizer.ggml.eom_token_id", t->eom);
  read_id("tokenizer.ggml.unknown_token_id", t->unk);
  if (auto v = gguf.get_bool("tokenizer.ggml.add_bos_token")) t->add_bos = *v;
  if (auto v = gguf.get_bool("tokenizer.ggml.add_eos_token")) t->add_eos = *v;
  if (t->add_bos && t->bos < 0) throw_format(gguf.path(), "the tokenizer adds BOS but has no valid bos_token_id");
  if (t->add_eos && t->eos < 0) throw_format(gguf.path(), "the tokenizer adds EOS but has no valid eos_token_id");
  t->chat_template = gguf.get_string("tokenizer.chat_template").value_or("");
  t->finalize();
  return std::make_unique<Tokenizer>(std::move(t));
}

std::unique_ptr<Tokenizer> Tokenizer::from_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) {
    throw_usage(path + ": no such file or directory (a .gguf file or an HF directory with tokenizer.json)");
  }
  if (fs::is_directory(path)) return from_hf_dir(path);
  const GgufFile gguf(path);
  return from_gguf(gguf);
}

}  // namespace servetune
