// Rank-driven BPE: merge table construction and the per-word merge loop (a binary heap of adjacent pairs,
// lowest rank first, leftmost first among equal ranks — the order of llama.cpp and HF tokenizers).
#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace servetune::tok {
namespace {

struct ExtraSymbols {
  TokenizerImpl& t;
  std::unordered_map<std::string, int32_t> ids;
  std::vector<std::string> texts;

  int32_t get(const std::string& text, bool strict, const char* what) {
    int32_t id = t.find(text);
    if (id >= 0) return id;
    if (strict) throw_format(t.source, std::string("merge ") + what + " '" + text + "' is not in the vocabulary");
    auto [it, inserted] = ids.emplace(text, t.vocab_size() + static_cast<int32_t>(texts.size()));
    if (inserted) texts.push_back(text);
    return it->second;
  }
};

bool heap_less(const MergeCandidate& a, const MergeCandidate& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
}

}  // namespace

void build_merges(TokenizerImpl& t, const std::vector<std::pair<std::string, std::string>>& rules, bool strict) {
  ExtraSymbols extra{t, {}, {}};
  t.merges.reserve(rules.size());
  for (size_t rank = 0; rank < rules.size(); ++rank) {
    const auto& [a, b] = rules[rank];
    int32_t left = extra.get(a, strict, "part");
    int32_t right = extra.get(b, strict, "part");
    int32_t result = extra.get(a + b, strict, "result");
    t.merges.insert(left, right, Merge{static_cast<int32_t>(rank), result});
  }
  for (int b = 0; b < 256; ++b) {
    t.byte_symbol[b] = t.symbol_mode == SymbolMode::kByteLevel
                           ? extra.get(unicode::byte_to_unicode(static_cast<uint8_t>(b)), false, "")
                           : -1;
  }
  // A symbol outside the vocabulary is emitted as the single-byte tokens of its text (llama.cpp).
  t.extra_symbol_output.clear();
  for (const std::string& text : extra.texts) {
    std::vector<int32_t> ids;
    for (char c : text) {
      int32_t id = t.find(std::string_view(&c, 1));
      if (id >= 0) ids.push_back(id);
    }
    t.extra_symbol_output.push_back(std::move(ids));
  }
}

void TokenizerImpl::emit_symbol(int32_t symbol, std::vector<int32_t>& out) const {
  if (symbol < vocab_size()) {
    out.push_back(symbol);
    return;
  }
  const auto& ids = extra_symbol_output[static_cast<size_t>(symbol - vocab_size())];
  out.insert(out.end(), ids.begin(), ids.end());
}

void TokenizerImpl::bpe_merge(Scratch& s, std::vector<int32_t>& out) const {
  auto& syms = s.syms;
  auto& heap = s.heap;
  heap.clear();
  auto push_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    Merge m = merges.find(syms[l].id, syms[r].id);
    if (m.rank < 0) return;
    heap.push_back(MergeCandidate{m.rank, 0.0f, l, r, syms[l].id, syms[r].id});
    std::push_heap(heap.begin(), heap.end(), heap_less);
  };
  const auto n = static_cast<int32_t>(syms.size());
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), heap_less);
    MergeCandidate c = heap.back();
    heap.pop_back();
    BpeSymbol& l = syms[c.left];
    BpeSymbol& r = syms[c.right];
    // Stale when either side has merged since (ids changed or the right one is gone).
    if (l.id != c.left_id || r.id != c.right_id || r.id < 0 || l.next != c.right) continue;
    l.id = merges.find(l.id, r.id).result;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.id = -1;
    push_pair(l.prev, c.left);
    push_pair(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = syms[i].next) emit_symbol(syms[i].id, out);
}

void TokenizerImpl::encode_bpe(std::string_view text, bool first_fragment, Scratch& s,
                               std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string_view input = text;
  if (!unicode::is_canonical_utf8(text)) {
    s.text = unicode::canonicalize_utf8(text);
    input = s.text;
  }
  if (symbol_mode == SymbolMode::kChars) {
    // Normalise (space -> space_text, optional prefix), then optionally split before each space_text.
    std::string norm;
    bool add_prefix = !prefix_text.empty() && (first_fragment || prefix_every_fragment);
    if (add_prefix && prefix_skip_if_present) {
      add_prefix = !(input.substr(0, 1) == " " || input.substr(0, prefix_text.size()) == prefix_text);
    }
    if (add_prefix) norm = prefix_text;
    for (char c : input) {
      if (c == ' ' && !space_text.empty()) {
        norm += space_text;
      } else {
        norm.push_back(c);
      }
    }
    size_t word_begin = 0;
    auto run_word = [&](size_t b, size_t e) {
      if (b >= e) return;
      std::string_view word(norm.data() + b, e - b);
      s.syms.clear();
      if (ignore_merges) {
        if (int32_t id = find(word); id >= 0) {
          out.push_back(id);
          return;
        }
      }
      size_t pos = 0;
      while (pos < word.size()) {
        size_t len = 0;
        unicode::decode_lenient(word, pos, len);
        int32_t id = find(word.substr(pos, len));
        auto push = [&](int32_t sym) {
          auto idx = static_cast<int32_t>(s.syms.size());
          s.syms.push_back(BpeSymbol{sym, idx - 1, -1, 0, 0});
          if (idx > 0) s.syms[static_cast<size_t>(idx - 1)].next = idx;
        };
        if (id >= 0) {
          push(id);
        } else {
          bool bytes_ok = byte_fallback;
          for (size_t k = 0; bytes_ok && k < len; ++k) bytes_ok = byte_token[static_cast<uint8_t>(word[pos + k])] >= 0;
          if (bytes_ok) {
            for (size_t k = 0; k < len; ++k) push(byte_token[static_cast<uint8_t>(word[pos + k])]);
          } else if (unk >= 0 && !(fuse_unk && !s.syms.empty() && s.syms.back().id == unk)) {
            push(unk);
          }
        }
        pos += len;
      }
      bpe_merge(s, out);
    };
    if (split_on_space_text && !space_text.empty()) {
      for (size_t p = norm.find(space_text, 1); p != std::string::npos; p = norm.find(space_text, p + 1)) {
        run_word(word_begin, p);
        word_begin = p;
      }
    }
    run_word(word_begin, norm.size());
    return;
  }

  std::string prefixed;
  if (byte_level_add_prefix_space && input.substr(0, 1) != " ") {
    prefixed.reserve(input.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(input);
    input = prefixed;
  }
  decode_codepoints(input, s.cps);
  s.ends.clear();
  pre_split(s.cps, 0, static_cast<uint32_t>(s.cps.size()), pre_splits, s.ends, s.split_tmp);
  uint32_t b = 0;
  std::string mapped;
  for (uint32_t e : s.ends) {
    const uint32_t byte_b = s.cps.offsets[b], byte_e = s.cps.offsets[e];
    b = e;
    std::string_view word = input.substr(byte_b, byte_e - byte_b);
    if (ignore_merges) {
      mapped.clear();
      for (char c : word) mapped += unicode::byte_to_unicode(static_cast<uint8_t>(c));
      if (int32_t id = find(mapped); id >= 0) {
        out.push_back(id);
        continue;
      }
    }
    s.syms.clear();
    for (size_t k = 0; k < word.size(); ++k) {
      auto idx = static_cast<int32_t>(k);
      s.syms.push_back(BpeSymbol{byte_symbol[static_cast<uint8_t>(word[k])], idx - 1,
                                 k + 1 < word.size() ? idx + 1 : -1, 0, 0});
    }
    bpe_merge(s, out);
  }
}

}  // namespace servetune::tok
