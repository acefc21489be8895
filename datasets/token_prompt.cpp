// Token-stable synthetic prompt generation (see token_prompt.h).
#include "datasets/token_prompt.h"

#include "servetune/tokenizer.h"

namespace servetune::datasets {

std::vector<int32_t> allowed_token_ids(const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.is_control(id) && !tokenizer.is_eog(id) && id != tokenizer.bos_id()) ids.push_back(id);
  }
  return ids;
}

int64_t num_special_tokens(const Tokenizer& tokenizer) {
  return (tokenizer.add_bos() && tokenizer.bos_id() >= 0 ? 1 : 0) +
         (tokenizer.add_eos() && tokenizer.eos_id() >= 0 ? 1 : 0);
}

std::string make_valid_utf8(std::string_view s) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < s.size()) {
    const unsigned char b = byte(i);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < s.size()) {
      const unsigned char c = byte(j);
      const bool ok = got == 0 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++j;
      ++got;
    }
    if (need > 0 && got == need) {
      out.append(s.substr(i, j - i));
    } else {
      out.append(kReplacement);
    }
    i = j;
  }
  return out;
}

namespace {

// Length of the UTF-8 character that ends `s` (1 for a stray continuation byte).
size_t last_char_len(const std::string& s) {
  size_t k = 1;
  while (k < s.size() && k < 4 && (static_cast<unsigned char>(s[s.size() - k]) & 0xC0) == 0x80) ++k;
  const unsigned char lead = static_cast<unsigned char>(s[s.size() - k]);
  return (lead & 0xC0) == 0xC0 ? k : 1;
}

// Text-level repair when the id-level rounds did not converge: trim characters until the text encodes to at
// most target_len tokens, then append pieces that each add exactly one token.
void repair_to_length(const Tokenizer& tokenizer, StablePrompt& p, size_t target_len,
                      const std::vector<int32_t>& allowed, Rng& rng) {
  const auto count = [&](const std::string& t) { return tokenizer.encode(t, false, false).size(); };
  size_t len = p.ids.size();
  while (len > target_len && !p.text.empty()) {
    p.text.resize(p.text.size() - last_char_len(p.text));
    len = count(p.text);
  }
  constexpr int kCandidates = 64;
  while (len < target_len) {
    bool grown = false;
    for (int c = 0; c < kCandidates && !grown; ++c) {
      const int32_t id = allowed[rng.below(allowed.size())];
      const std::string candidate = p.text + make_valid_utf8(tokenizer.decode(std::vector<int32_t>{id}, false));
      const size_t n = count(candidate);
      if (n == len + 1) {
        p.text = candidate;
        len = n;
        grown = true;
      }
    }
    if (!grown) break;
  }
  p.ids = tokenizer.encode(p.text, false, false);
}

}  // namespace

StablePrompt make_stable_prompt(const Tokenizer& tokenizer, std::vector<int32_t> ids, size_t target_len,
                                const std::vector<int32_t>& allowed, Rng& rng, int max_rounds) {
  StablePrompt p;
  for (;;) {
    p.text = make_valid_utf8(tokenizer.decode(ids, /*skip_special=*/false));
    p.ids = tokenizer.encode(p.text, /*add_special=*/false, /*parse_special=*/false);
    ++p.rounds;
    if (p.ids.size() == target_len) return p;
    if (p.rounds > max_rounds) break;
    ids = p.ids;
    if (ids.size() > target_len) {
      ids.resize(target_len);
    } else {
      while (ids.size() < target_len) ids.push_back(allowed[rng.below(allowed.size())]);
    }
  }
  repair_to_length(tokenizer, p, target_len, allowed, rng);
  return p;
}

std::string random_stable_text(const Tokenizer& tokenizer, int64_t len, const std::vector<int32_t>& allowed, Rng& rng) {
  if (len <= 0) return "";
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < len; ++i) ids.push_back(allowed[rng.below(allowed.size())]);
  return make_stable_prompt(tokenizer, std::move(ids), static_cast<size_t>(len), allowed, rng).text;
}

}  // namespace servetune::datasets
