// Incremental detokenization with stop strings (see output_text.h).
#include "runtime/output_text.h"

#include <algorithm>

namespace servetune {

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop)
    : decoder_(tokenizer, /*skip_special=*/true), vocab_(tokenizer.vocab_size()), stop_(std::move(stop)) {
  for (const auto& s : stop_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

std::string OutputText::push(int32_t token) {
  if (stopped_) return {};
  if (token >= 0 && token < vocab_) text_ += decoder_.push(token);  // padded model vocabularies have ids without text
  return release(false);
}

std::string OutputText::finish() {
  if (!stopped_) text_ += decoder_.flush();
  return release(true);
}

std::string OutputText::release(bool at_end) {
  if (!stopped_ && !stop_.empty()) {
    // A match must end in text added since the last release, so it starts at most max_stop_len - 1 bytes earlier.
    const size_t from = emitted_ >= max_stop_len_ ? emitted_ - max_stop_len_ + 1 : 0;
    size_t cut = std::string::npos;
    for (const auto& s : stop_) cut = std::min(cut, text_.find(s, from));
    if (cut != std::string::npos) {
      text_.resize(cut);
      stopped_ = true;
    }
  }
  size_t end = text_.size();
  if (!stopped_ && !at_end && max_stop_len_ > 1) {
    end = text_.size() >= max_stop_len_ - 1 ? text_.size() - (max_stop_len_ - 1) : 0;
    while (end > emitted_ && end < text_.size() && (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) --end;
  }
  if (end <= emitted_) return {};
  std::string out = text_.substr(emitted_, end - emitted_);
  emitted_ = end;
  return out;
}

}  // namespace servetune
