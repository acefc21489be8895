// Per-request output text: incremental detokenization plus stop-string handling. Text that could still turn into
// a stop string is held back; when a stop string appears, the text is cut before it.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace servetune {

class OutputText {
 public:
  OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop);

  // Adds a token; returns the text that can be released now. Sets stopped() when a stop string matched.
  std::string push(int32_t token);
  // Releases everything held back (at the end of the request).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::string release(bool at_end);

  IncrementalDecoder decoder_;
  int32_t vocab_;
  std::vector<std::string> stop_;
  size_t max_stop_len_ = 0;
  std::string text_;     // all decoded text so far (cut at a matched stop string)
  size_t emitted_ = 0;   // bytes of text_ already released
  bool stopped_ = false;
};

}  // namespace servetune
