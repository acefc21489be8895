// Incremental text/event-stream parser (WHATWG HTML "server-sent events"): bytes go in split anywhere, whole
// events come out. Lines end at CRLF, LF or CR; the data lines of one event are joined with '\n'; lines starting
// with ':' are comments; a leading BOM is skipped. Field names other than data/event/id/retry/sent-ns are counted as
// malformed lines, since an OpenAI-compatible server never sends them.
//
// "sent-ns: N" is servetune's send stamp (the mock server writes one before each event's data line): when the
// server sent the event, in nanoseconds of CLOCK_MONOTONIC, so a client on the same host can measure how late it
// read the event. A custom field rather than "id:" or a comment: the spec has conforming clients ignore unknown
// fields, whereas "id:" sets the Last-Event-ID a reconnecting client sends back (and real servers use it with
// their own meaning) and comments are free text that servers send as keep-alives. Like "event:", it belongs to the
// event it precedes and resets at the event's end.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <time.h>

namespace servetune::loadgen {

struct SseEvent {
  std::string_view type;  // "event:" field, empty when absent
  std::string_view data;
  std::string_view id;
  int64_t sent_ns = -1;  // the event's "sent-ns" field, -1 when absent
};

inline constexpr std::string_view kSentNsField = "sent-ns";

// The clock of "sent-ns" stamps, for the server writing them and the client reading them: CLOCK_MONOTONIC in
// nanoseconds, one clock for every process on the host.
inline int64_t sent_ns_clock() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

class SseParser {
 public:
  // Calls on_event(const SseEvent&) for each completed event; views are valid only during the call.
  template <class F>
  void feed(std::string_view bytes, F&& on_event) {
    if (!bom_checked_) {
      bom_buf_.append(bytes);
      static constexpr std::string_view kBom = "\xEF\xBB\xBF";
      if (bom_buf_.size() < kBom.size() && kBom.substr(0, bom_buf_.size()) == bom_buf_) return;
      bom_checked_ = true;
      std::string pending = std::move(bom_buf_);
      std::string_view rest = pending;
      if (rest.substr(0, kBom.size()) == kBom) rest.remove_prefix(kBom.size());
      feed_lines(rest, on_event);
      return;
    }
    feed_lines(bytes, on_event);
  }

  // End of stream: a final line without a terminator is taken as complete and an event whose blank line never
  // came is dispatched (a truncated JSON payload then fails to parse). Returns true if anything was pending.
  template <class F>
  bool finish(F&& on_event) {
    bool pending = !line_.empty() || has_data_;
    if (!bom_checked_ && !bom_buf_.empty()) {
      bom_checked_ = true;
      std::string b = std::move(bom_buf_);
      feed_lines(b, on_event);
      pending = true;
    }
    if (!line_.empty()) {
      std::string line = std::move(line_);
      line_.clear();
      process_line(line, on_event);
    }
    if (has_data_) dispatch(on_event);
    return pending;
  }

  // Back to the start of a new stream, keeping the buffers' capacity (a pooled parser allocates nothing per stream).
  void reset() {
    line_.clear();
    data_.clear();
    type_.clear();
    id_.clear();
    bom_buf_.clear();
    first_malformed_.clear();
    sent_ns_ = -1;
    has_data_ = skip_lf_ = bom_checked_ = false;
    comments_ = malformed_ = 0;
  }

  int64_t comments() const { return comments_; }
  // Lines with an unknown field name or a sent-ns value that is not a decimal integer; the first one described.
  int64_t malformed() const { return malformed_; }
  const std::string& first_malformed() const { return first_malformed_; }

 private:
  template <class F>
  void feed_lines(std::string_view bytes, F& on_event) {
    size_t pos = 0;
    if (skip_lf_ && !bytes.empty()) {
      if (bytes[0] == '\n') pos = 1;
      skip_lf_ = false;
    }
    // Next CR and LF positions, each found with memchr and reused until passed (CR is rare in practice).
    size_t next_cr = 0, next_lf = 0;
    bool cr_known = false, lf_known = false;
    const auto find = [&](char c, size_t from) {
      const void* hit = std::memchr(bytes.data() + from, c, bytes.size() - from);
      return hit == nullptr ? bytes.size() : static_cast<size_t>(static_cast<const char*>(hit) - bytes.data());
    };
    while (pos < bytes.size()) {
      if (!cr_known || next_cr < pos) next_cr = find('\r', pos), cr_known = true;
      if (!lf_known || next_lf < pos) next_lf = find('\n', pos), lf_known = true;
      const size_t end = std::min(next_cr, next_lf);
      if (end == bytes.size()) {
        line_.append(bytes.substr(pos));
        return;
      }
      if (bytes[end] == '\r') {
        if (end + 1 < bytes.size()) {
          if (bytes[end + 1] == '\n') {
            complete_line(bytes.substr(pos, end - pos), on_event);
            pos = end + 2;
            continue;
          }
        } else {
          skip_lf_ = true;
        }
      }
      complete_line(bytes.substr(pos, end - pos), on_event);
      pos = end + 1;
    }
  }

  template <class F>
  void complete_line(std::string_view tail, F& on_event) {
    if (line_.empty()) {
      process_line(tail, on_event);
    } else {
      line_.append(tail);
      scratch_.swap(line_);
      line_.clear();
      process_line(scratch_, on_event);
    }
  }

  template <class F>
  void process_line(std::string_view line, F& on_event) {
    if (line.empty()) {
      if (has_data_) dispatch(on_event);
      type_.clear();
      sent_ns_ = -1;
      return;
    }
    if (line[0] == ':') {
      ++comments_;
      return;
    }
    const size_t colon = line.find(':');
    std::string_view field = line.substr(0, colon);
    std::string_view value;
    if (colon != std::string_view::npos) {
      value = line.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    }
    if (field == "data") {
      if (has_data_) data_.push_back('\n');
      data_.append(value);
      has_data_ = true;
    } else if (field == "event") {
      type_.assign(value);
    } else if (field == "id") {
      if (value.find('\0') == std::string_view::npos) id_.assign(value);
    } else if (field == kSentNsField) {
      if (!parse_stamp(value)) note_malformed("sent-ns is not a decimal integer: '", value);
    } else if (field != "retry") {
      note_malformed("unexpected field '", field);
    }
  }

  bool parse_stamp(std::string_view v) {
    if (v.empty() || v.size() > 18) return false;  // up to 18 digits: no int64 overflow
    int64_t n = 0;
    for (char c : v) {
      if (c < '0' || c > '9') return false;
      n = n * 10 + (c - '0');
    }
    sent_ns_ = n;
    return true;
  }

  void note_malformed(std::string_view what, std::string_view text) {
    if (malformed_++ > 0) return;
    first_malformed_.assign(what);
    first_malformed_.append(text.substr(0, 64));
    first_malformed_.push_back('\'');
  }

  template <class F>
  void dispatch(F& on_event) {
    on_event(SseEvent{type_, data_, id_, sent_ns_});
    data_.clear();
    type_.clear();
    sent_ns_ = -1;
    has_data_ = false;
  }

  std::string line_;     // bytes of an unterminated line
  std::string scratch_;  // a completed multi-chunk line while it is processed (keeps its capacity)
  std::string data_;
  std::string type_;
  std::string id_;
  std::string bom_buf_;
  std::string first_malformed_;
  int64_t sent_ns_ = -1;
  bool has_data_ = false;
  bool skip_lf_ = false;
  bool bom_checked_ = false;
  int64_t comments_ = 0;
  int64_t malformed_ = 0;
};

}  // namespace servetune::loadgen
