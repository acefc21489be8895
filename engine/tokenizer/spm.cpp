// SentencePiece-style BPE as llama.cpp runs it for "llama" vocabularies: the text (spaces escaped to "▁")
// is cut into UTF-8 characters, adjacent symbols whose concatenation is a token merge highest score first
// (leftmost among equal scores), and symbols that are not tokens fall back to <0xXX> byte tokens.
#include <algorithm>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace servetune::tok {
namespace {

bool spm_heap_less(const MergeCandidate& a, const MergeCandidate& b) {
  return a.score < b.score || (a.score == b.score && a.left > b.left);
}

}  // namespace

void TokenizerImpl::encode_spm(std::string_view fragment, bool after_special, Scratch& s,
                               std::vector<int32_t>& out) const {
  std::string& text = s.text;
  text.clear();
  if (add_space_prefix && after_special) text += "\xE2\x96\x81";
  for (char c : fragment) {
    if (c == ' ') {
      text += "\xE2\x96\x81";
    } else {
      text.push_back(c);
    }
  }
  auto& syms = s.syms;
  syms.clear();
  for (size_t pos = 0; pos < text.size();) {
    size_t len = std::min(unicode::utf8_len_from_lead(static_cast<uint8_t>(text[pos])), text.size() - pos);
    auto idx = static_cast<int32_t>(syms.size());
    syms.push_back(BpeSymbol{0, idx - 1, pos + len < text.size() ? idx + 1 : -1, static_cast<uint32_t>(pos),
                             static_cast<uint32_t>(len)});
    pos += len;
  }
  auto& heap = s.heap;
  heap.clear();
  auto push_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t len = syms[l].len + syms[r].len;
    if (len > max_token_len) return;
    int32_t id = find(std::string_view(text.data() + syms[l].begin, len));
    if (id < 0) return;
    heap.push_back(MergeCandidate{0, scores[static_cast<size_t>(id)], l, r, static_cast<int32_t>(len), 0});
    std::push_heap(heap.begin(), heap.end(), spm_heap_less);
  };
  const auto n = static_cast<int32_t>(syms.size());
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), spm_heap_less);
    MergeCandidate c = heap.back();
    heap.pop_back();
    BpeSymbol& l = syms[c.left];
    BpeSymbol& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != static_cast<uint32_t>(c.left_id)) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    push_pair(l.prev, c.left);
    push_pair(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = syms[i].next) {
    std::string_view piece(text.data() + syms[i].begin, syms[i].len);
    int32_t id = find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char c : piece) {
      int32_t b = byte_token[static_cast<uint8_t>(c)];
      if (b < 0) b = find(std::string_view(&c, 1));
      if (b < 0) b = unk;  // llama.cpp aborts here; a vocabulary without byte tokens gets <unk>
      if (b >= 0) out.push_back(b);
    }
  }
}

}  // namespace servetune::tok
