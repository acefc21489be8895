// Token-stable synthetic prompts: token ids are decoded to text and the text re-encoded, adjusting the ids until
// encode(text) has the requested length (decode -> encode is not the identity for BPE vocabularies).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/rng.h"

namespace servetune {
class Tokenizer;
}

namespace servetune::datasets {

// Ids a synthetic prompt may use: every id except control / unknown tokens.
std::vector<int32_t> allowed_token_ids(const Tokenizer& tokenizer);

// Special tokens the tokenizer adds to a text prompt (BOS and/or EOS), as HF's num_special_tokens_to_add().
int64_t num_special_tokens(const Tokenizer& tokenizer);

// Replaces each maximal ill-formed UTF-8 subpart with U+FFFD (decoded byte tokens may split a character).
std::string make_valid_utf8(std::string_view bytes);

struct StablePrompt {
  std::string text;
  std::vector<int32_t> ids;  // encode(text) without special tokens
  int rounds = 0;            // decode/encode rounds used
};

// Decodes `ids`, re-encodes without special tokens; while the length differs from target_len, truncates or
// appends ids drawn from `allowed` and repeats (at most max_rounds), then repairs the text itself (trims
// characters, appends one-token pieces). `text` always re-encodes to `ids`, whose length is target_len unless
// even the repair failed.
StablePrompt make_stable_prompt(const Tokenizer& tokenizer, std::vector<int32_t> ids, size_t target_len,
                                const std::vector<int32_t>& allowed, Rng& rng, int max_rounds = 10);

// `len` random tokens drawn from `allowed` made into stable text (make_stable_prompt); "" for len <= 0.
std::string random_stable_text(const Tokenizer& tokenizer, int64_t len, const std::vector<int32_t>& allowed, Rng& rng);

}  // namespace servetune::datasets
