// Tokenizer::from_hf_dir: HF tokenizer.json with a BPE model (byte-level pre-tokenizer, or Metaspace /
// Prepend+Replace normalisation with byte fallback), its added tokens, and tokenizer_config.json /
// generation_config.json for bos/eos, add_bos_token and the chat template. Anything else: Error(kUnsupported).
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace servetune {
namespace {

using nlohmann::json;
using tok::PreSplit;

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_io(path, "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw_format(path, std::string("invalid JSON: ") + e.what());
  }
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

// Flattens a component that may be a "Sequence" of components.
std::vector<json> flatten(const json& j, const char* list_key) {
  std::vector<json> out;
  if (j.is_null()) return out;
  if (type_of(j) == "Sequence") {
    for (const json& item : j.value(list_key, json::array())) {
      auto sub = flatten(item, list_key);
      out.insert(out.end(), sub.begin(), sub.end());
    }
  } else {
    out.push_back(j);
  }
  return out;
}

std::optional<PreSplit> split_for_regex(const std::string& re) {
  const std::string contractions_ci = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
  const std::string contractions_cls = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
  const std::string llama3_tail = "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string qwen2_tail = "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  if (re == contractions_ci + llama3_tail || re == contractions_cls + llama3_tail) return PreSplit::kLlama3;
  if (re == contractions_ci + qwen2_tail || re == contractions_cls + qwen2_tail) return PreSplit::kQwen2;
  if (re == "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+") return PreSplit::kGpt2;
  if (re == "\\p{N}") return PreSplit::kDigits;
  return std::nullopt;
}

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

void configure_pipeline(tok::TokenizerImpl& t, const json& root, const std::string& file) {
  auto unsupported = [&](const std::string& what) { throw_unsupported(file + ": " + what + " is not supported"); };
  bool byte_level = false, metaspace = false;
  for (const json& n : flatten(root.value("normalizer", json()), "normalizers")) {
    const std::string type = type_of(n);
    if (type == "Prepend") {
      t.prefix_text = n.value("prepend", "");
      t.prefix_every_fragment = true;
    } else if (type == "Replace" && n.contains("pattern") && n["pattern"].contains("String") &&
               n["pattern"]["String"] == " ") {
      t.space_text = n.value("content", "");
      metaspace = true;
    } else {
      unsupported("normalizer '" + type + "'");
    }
  }
  for (const json& p : flatten(root.value("pre_tokenizer", json()), "pretokenizers")) {
    const std::string type = type_of(p);
    if (type == "ByteLevel") {
      byte_level = true;
      if (p.value("use_regex", true)) t.pre_splits.push_back(PreSplit::kGpt2);
      t.byte_level_add_prefix_space = p.value("add_prefix_space", false);
    } else if (type == "Digits") {
      if (!p.value("individual_digits", false)) unsupported("pre-tokenizer Digits with individual_digits=false");
      t.pre_splits.push_back(PreSplit::kDigits);
    } else if (type == "Split") {
      const json& pat = p.value("pattern", json::object());
      std::string re = pat.contains("Regex") ? pat["Regex"].get<std::string>() : "";
      auto split = split_for_regex(re);
      if (!split || p.value("behavior", "") != "Isolated" || p.value("invert", false)) {
        unsupported("pre-tokenizer Split with pattern '" + re + "' and behavior '" + p.value("behavior", "") + "'");
      }
      t.pre_splits.push_back(*split);
    } else if (type == "Metaspace") {
      metaspace = true;
      t.space_text = p.value("replacement", "\xE2\x96\x81");
      std::string scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
      if (scheme != "never") {
        t.prefix_text = t.space_text;
        t.prefix_every_fragment = scheme == "always";
        t.prefix_skip_if_present = true;
      }
      t.split_on_space_text = p.value("split", true);
    } else {
      unsupported("pre-tokenizer '" + type + "'");
    }
  }
  if (byte_level && metaspace) unsupported("combining ByteLevel with Metaspace/Replace");
  if (t.byte_level_add_prefix_space && t.pre_splits.size() > 1) unsupported("ByteLevel add_prefix_space after other pre-tokenizers");
  for (const json& d : flatten(root.value("decoder", json()), "decoders")) {
    const std::string type = type_of(d);
    if (type == "ByteLevel") byte_level = true;
    if (type == "Strip" && d.value("start", 0) == 1) t.add_space_prefix = true;
    if (type == "Metaspace" && d.value("prepend_scheme", d.value("add_prefix_space", true) ? "always" : "never") != "never") {
      t.add_space_prefix = true;
    }
  }
  t.strip_joined_space = t.add_space_prefix;
  t.add_space_prefix = false;
  t.symbol_mode = byte_level ? tok::SymbolMode::kByteLevel : tok::SymbolMode::kChars;
  if (byte_level && t.pre_splits.empty()) t.pre_splits.push_back(PreSplit::kGpt2);
  if (!byte_level) t.pre_splits.clear();
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string file = (fs::path(dir) / "tokenizer.json").string();
  if (!fs::exists(file)) throw_io(dir, "no tokenizer.json in this directory");
  const json root = read_json(file);
  auto t = std::make_unique<tok::TokenizerImpl>();
  t->source = dir;
  t->model_type = "hf-bpe";
  t->kind = tok::ModelKind::kBpe;
  const json& model = root.value("model", json::object());
  if (!model.is_object() || model.value("type", "BPE") != "BPE") {
    throw_unsupported(file + ": tokenizer model '" + type_of(model) + "' is not supported (only BPE)");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw_format(file, "model.vocab is missing");
  if (!model.value("continuing_subword_prefix", json()).is_null() && model["continuing_subword_prefix"] != "") {
    throw_unsupported(file + ": BPE continuing_subword_prefix is not supported");
  }
  if (!model.value("end_of_word_suffix", json()).is_null() && model["end_of_word_suffix"] != "") {
    throw_unsupported(file + ": BPE end_of_word_suffix is not supported");
  }
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() != 0.0) {
    throw_unsupported(file + ": BPE dropout is not supported");
  }

  std::vector<std::pair<int64_t, std::string>> entries;
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) throw_format(file, "vocab entry '" + text + "' has a non-integer id");
    entries.emplace_back(id.get<int64_t>(), text);
  }
  const json& added = root.value("added_tokens", json::array());
  for (const json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content")) {
      throw_format(file, "added_tokens entry without id/content");
    }
    entries.emplace_back(a["id"].get<int64_t>(), a["content"].get<std::string>());
  }
  int64_t max_id = -1;
  for (const auto& e : entries) {
    if (e.first < 0 || e.first > 0x7FFFFFF0) throw_format(file, "token id " + std::to_string(e.first) + " out of range");
    max_id = std::max(max_id, e.first);
  }
  if (max_id < 0) throw_format(file, "empty vocabulary");
  const auto n = static_cast<size_t>(max_id + 1);
  t->texts.assign(n, std::string());
  std::vector<bool> seen(n, false);
  for (const auto& [id, text] : entries) {
    auto i = static_cast<size_t>(id);
    if (seen[i] && t->texts[i] != text) throw_format(file, "id " + std::to_string(id) + " is both '" + t->texts[i] + "' and '" + text + "'");
    t->texts[i] = text;
    seen[i] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!seen[i]) throw_format(file, "no token has id " + std::to_string(i) + " (ids must be contiguous)");
  }
  t->scores.assign(n, 0.0f);
  t->attrs.assign(n, tok::kAttrNormal);
  t->byte_fallback = model.value("byte_fallback", false);
  t->fuse_unk = model.value("fuse_unk", false);
  t->ignore_merges = model.value("ignore_merges", false);
  for (const json& a : added) {
    auto id = static_cast<size_t>(a["id"].get<int64_t>());
    if (a.value("single_word", false)) throw_unsupported(file + ": added token '" + t->texts[id] + "' with single_word");
    uint32_t attr = a.value("special", false) ? tok::kAttrControl : tok::kAttrUserDefined;
    if (a.value("lstrip", false)) attr |= tok::kAttrLstrip;
    if (a.value("rstrip", false)) attr |= tok::kAttrRstrip;
    t->attrs[id] = attr;
  }
  bool decodes_bytes = false;
  for (const json& d : flatten(root.value("decoder", json()), "decoders")) decodes_bytes |= type_of(d) == "ByteFallback";
  if (t->byte_fallback && decodes_bytes) {  // otherwise HF decodes <0xXX> tokens as their text
    for (size_t i = 0; i < n; ++i) {
      const std::string& s = t->texts[i];
      if (t->attrs[i] == tok::kAttrNormal && s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>') t->attrs[i] = tok::kAttrByte;
    }
  }
  t->index_texts();
  if (model.contains("unk_token") && model["unk_token"].is_string()) t->unk = t->find(model["unk_token"].get<std::string>());

  configure_pipeline(*t, root, file);

  std::vector<std::pair<std::string, std::string>> rules;
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) throw_format(file, "merge '" + s + "' has no space");
      rules.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      rules.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      throw_format(file, "merges entry is neither \"a b\" nor [a, b]");
    }
  }
  tok::build_merges(*t, rules, true);

  // Special tokens and flags: tokenizer_config.json first, then the post-processor template.
  const std::string config_file = (fs::path(dir) / "tokenizer_config.json").string();
  json config = fs::exists(config_file) ? read_json(config_file) : json::object();
  auto id_of = [&](const json& j) { return j.is_null() ? -1 : t->find(token_content(j)); };
  t->bos = id_of(config.value("bos_token", json()));
  t->eos = id_of(config.value("eos_token", json()));
  for (const json& p : flatten(root.value("post_processor", json()), "processors")) {
    if (type_of(p) != "TemplateProcessing") continue;
    const json& single = p.value("single", json::array());
    if (!single.empty() && single.front().contains("SpecialToken")) {
      int32_t id = t->find(single.front()["SpecialToken"].value("id", ""));
      if (id >= 0) {
        t->add_bos = true;
        if (t->bos < 0) t->bos = id;
      }
    }
    if (single.size() > 1 && single.back().contains("SpecialToken")) {
      int32_t id = t->find(single.back()["SpecialToken"].value("id", ""));
      if (id >= 0) {
        t->add_eos = true;
        if (t->eos < 0) t->eos = id;
      }
    }
  }
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) t->add_bos = config["add_bos_token"].get<bool>();
  if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean()) t->add_eos = config["add_eos_token"].get<bool>();
  if (t->add_bos && t->bos < 0) throw_format(config_file, "add_bos_token is set but there is no bos_token");
  if (t->add_eos && t->eos < 0) throw_format(config_file, "add_eos_token is set but there is no eos_token");
  const json& tmpl = config.value("chat_template", json());
  if (tmpl.is_string()) {
    t->chat_template = tmpl.get<std::string>();
  } else if (tmpl.is_array()) {
    for (const json& e : tmpl) {
      if (e.value("name", "") == "default") t->chat_template = e.value("template", "");
    }
  }
  const std::string gen_file = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen_file)) {
    json gen = read_json(gen_file);
    json ids = gen.value("eos_token_id", json());
    if (ids.is_number_integer()) ids = json::array({ids});
    for (const json& id : ids.is_array() ? ids : json::array()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(n)) continue;
      auto i = static_cast<int32_t>(id.get<int64_t>());
      if (t->eos < 0) t->eos = i;
      t->extra_eog.push_back(i);
    }
  }
  t->finalize();
  return std::make_unique<Tokenizer>(std::move(t));
}

}  // namespace servetune
