// Tokenizer: special-token partitioning (llama.cpp order: longest special text first), encode dispatch to
// the SPM / BPE engines, decode with llama_detokenize's rules (leading-space removal, clean-up passes).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace servetune {
namespace {

struct Fragment {
  int32_t token;  // -1: raw text
  uint32_t offset, length;
};

void check_id(const tok::TokenizerImpl& t, int32_t id) {
  if (id < 0 || id >= t.vocab_size()) {
    throw_usage("token id " + std::to_string(id) + " is out of range [0, " + std::to_string(t.vocab_size()) +
                ") for the tokenizer of " + t.source);
  }
}

void partition_special(const tok::TokenizerImpl& t, std::string_view text, bool parse_special,
                       std::vector<Fragment>& frags) {
  frags.clear();
  if (text.empty()) return;
  frags.push_back(Fragment{-1, 0, static_cast<uint32_t>(text.size())});
  std::vector<Fragment> next;
  for (int32_t id : t.special_order) {
    const uint32_t attr = t.attrs[static_cast<size_t>(id)];
    if (!parse_special && (attr & (tok::kAttrControl | tok::kAttrUnknown))) continue;
    const std::string& special = t.texts[static_cast<size_t>(id)];
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      uint32_t off = f.offset, len = f.length;
      while (len > 0) {
        size_t match = text.substr(0, off + len).find(special, off);
        if (match == std::string_view::npos) break;
        changed = true;
        auto m = static_cast<uint32_t>(match);
        uint32_t left_len = m - off;
        if (attr & tok::kAttrLstrip) {
          while (left_len > 0 && std::isspace(static_cast<unsigned char>(text[off + left_len - 1]))) --left_len;
        }
        if (left_len > 0) next.push_back(Fragment{-1, off, left_len});
        next.push_back(Fragment{id, m, static_cast<uint32_t>(special.size())});
        uint32_t right = m + static_cast<uint32_t>(special.size());
        uint32_t right_len = off + len - right;
        if (attr & tok::kAttrRstrip) {
          while (right_len > 0 && std::isspace(static_cast<unsigned char>(text[right]))) {
            ++right;
            --right_len;
          }
        }
        off = right;
        len = right_len;
      }
      if (len > 0) next.push_back(Fragment{-1, off, len});
    }
    if (changed) frags.swap(next);
  }
}

// llama_detokenize's clean_up_tokenization_spaces passes, in place.
void clean_spaces(std::string& s) {
  char* text = s.data();
  auto total = static_cast<int64_t>(s.size());
  const int64_t total1 = total;
  total = total ? 1 : 0;
  for (int64_t i = 1; i < total1; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    text[total++] = x;
  }
  const int64_t total2 = total;
  total = total ? 1 : 0;
  for (int64_t i = 1; i < total2; ++i) {
    const char x = text[i];
    if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
      --total;
      text[++i] = '\0';
    }
    text[total++] = x;
  }
  const int64_t total3 = total;
  total = total ? 1 : 0;
  for (int64_t i = 1; i < total3; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    text[total++] = x;
  }
  s.resize(static_cast<size_t>(total));
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<tok::TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const tok::TokenizerImpl& t = *impl_;
  if (text.size() >= 0xFFFFFFF0u) throw_usage("text of " + std::to_string(text.size()) + " bytes is too long to tokenize");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::vector<Fragment> frags;
  partition_special(t, text, parse_special, frags);
  if (add_special && t.add_bos && t.bos >= 0) out.push_back(t.bos);
  tok::Scratch scratch;
  bool prev_special = true;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string_view piece = text.substr(f.offset, f.length);
    if (t.kind == tok::ModelKind::kSpm) {
      t.encode_spm(piece, prev_special, scratch, out);
    } else {
      t.encode_bpe(piece, f.offset == 0, scratch, out);
    }
    prev_special = false;
  }
  if (add_special && t.add_eos && t.eos >= 0) out.push_back(t.eos);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const tok::TokenizerImpl& t = *impl_;
  for (int32_t id : ids) check_id(t, id);
  bool remove_space = t.add_space_prefix;
  if (skip_special && t.add_bos && !ids.empty() && ids.front() == t.bos) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (skip_special && t.add_eos && !ids.empty() && ids.back() == t.eos) ids = ids.first(ids.size() - 1);
  std::string out;
  for (int32_t id : ids) {
    const bool hidden = skip_special && (t.attrs[static_cast<size_t>(id)] & (tok::kAttrControl | tok::kAttrUnknown));
    if (!hidden) {
      std::string_view piece = t.pieces[static_cast<size_t>(id)];
      if (remove_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
      out += piece;
    }
    remove_space = false;
  }
  if (t.strip_joined_space && !out.empty() && out.front() == ' ') out.erase(0, 1);
  if (t.clean_spaces) clean_spaces(out);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  check_id(*impl_, id);
  return impl_->pieces[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(*impl_, id);
  return impl_->texts[static_cast<size_t>(id)];
}

int32_t Tokenizer::find_token(std::string_view text) const { return impl_->find(text); }

bool Tokenizer::is_control(int32_t id) const {
  check_id(*impl_, id);
  return (impl_->attrs[static_cast<size_t>(id)] & (tok::kAttrControl | tok::kAttrUnknown)) != 0;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id); }
const std::vector<int32_t>& Tokenizer::eog_ids() const { return impl_->eog; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
const std::string& Tokenizer::model_type() const { return impl_->model_type; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::source() const { return impl_->source; }

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  const tok::TokenizerImpl& t = tokenizer_.impl();
  check_id(t, id);
  if (!(skip_special_ && (t.attrs[static_cast<size_t>(id)] & (tok::kAttrControl | tok::kAttrUnknown)))) {
    pending_ += t.pieces[static_cast<size_t>(id)];
  }
  return take_complete(false);
}

std::string IncrementalDecoder::flush() { return take_complete(true); }

std::string IncrementalDecoder::take_complete(bool at_end) {
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    size_t len = 0;
    unicode::Utf8Step step = unicode::utf8_step(pending_, pos, len);
    if (step == unicode::Utf8Step::kIncomplete && !at_end) break;
    if (step == unicode::Utf8Step::kOk) {
      out.append(pending_, pos, len);
    } else {
      unicode::append_utf8(out, unicode::kReplacementChar);
    }
    pos += len;
  }
  pending_.erase(0, pos);
  return out;
}

}  // namespace servetune
