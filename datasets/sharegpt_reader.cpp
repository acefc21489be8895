// ShareGPT SAX reader (see sharegpt_reader.h).
#include "datasets/sharegpt_reader.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "datasets/rng.h"
#include "servetune/error.h"

namespace servetune::datasets {
namespace {

class ShareGptSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  ShareGptSax(std::string path, size_t size, int64_t max_turns, ShareGptFile& out)
      : path_(std::move(path)), size_(size), max_turns_(max_turns), out_(out) {}

  bool null() override { return scalar(nullptr); }
  bool boolean(bool) override { return scalar(nullptr); }
  bool number_integer(number_integer_t) override { return scalar(nullptr); }
  bool number_unsigned(number_unsigned_t) override { return scalar(nullptr); }
  bool number_float(number_float_t, const string_t&) override { return scalar(nullptr); }
  bool binary(binary_t&) override { return scalar(nullptr); }
  bool string(string_t& val) override { return scalar(&val); }

  bool key(string_t& val) override {
    frames_.back().key = val;
    return true;
  }

  bool start_object(std::size_t) override {
    if (frames_.empty()) throw_format(path_, "expected a JSON array of conversations at the top level");
    Frame& parent = frames_.back();
    if (parent.role == Role::kTop) {
      cur_ = Entry{};
      frames_.push_back({Role::kEntry});
    } else if (parent.role == Role::kConversations) {
      frames_.push_back({Role::kTurn, {}, parent.count++});
    } else {
      frames_.push_back({Role::kOther});
    }
    return true;
  }

  bool end_object() override {
    if (frames_.back().role == Role::kEntry) {
      ++out_.entries;
      finish_entry();
    }
    frames_.pop_back();
    return true;
  }

  bool start_array(std::size_t) override {
    if (frames_.empty()) {
      frames_.push_back({Role::kTop});
      return true;
    }
    Frame& parent = frames_.back();
    if (parent.role == Role::kEntry && parent.key == "conversations") {
      cur_.has_conversations = true;
      frames_.push_back({Role::kConversations});
    } else {
      if (parent.role == Role::kConversations) parent.count++;
      frames_.push_back({Role::kOther});
    }
    return true;
  }

  bool end_array() override {
    if (frames_.back().role == Role::kConversations) cur_.turns = frames_.back().count;
    frames_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    // The lexer counts the end-of-input it read as one more character: past the end means the file ran out.
    if (position > size_ && !frames_.empty() && frames_.front().role == Role::kTop) {
      out_.truncated = true;
      return false;
    }
    throw_format(path_, "invalid JSON near byte " + std::to_string(position) + ": " + ex.what());
  }

 private:
  enum class Role { kTop, kEntry, kConversations, kTurn, kOther };
  struct Frame {
    Role role;
    std::string key;
    int64_t count = 0;  // kConversations: turns seen; kTurn: this turn's index
  };
  struct Entry {
    bool has_conversations = false;
    int64_t turns = 0;
    std::vector<std::string> values;  // by turn index, up to max_turns_
    std::vector<bool> have;
  };

  bool scalar(string_t* s) {
    if (frames_.empty()) throw_format(path_, "expected a JSON array of conversations at the top level");
    Frame& parent = frames_.back();
    if (parent.role == Role::kConversations) parent.count++;
    if (parent.role == Role::kTurn && parent.key == "value" && s != nullptr && parent.count < max_turns_) {
      const size_t t = static_cast<size_t>(parent.count);
      if (cur_.values.size() <= t) {
        cur_.values.resize(t + 1);
        cur_.have.resize(t + 1, false);
      }
      cur_.values[t] = std::move(*s);
      cur_.have[t] = true;
    }
    return true;
  }

  void finish_entry() {
    if (!cur_.has_conversations || cur_.turns < 2) {
      ++out_.dropped_short;
      return;
    }
    size_t n = 0;  // leading turns that have a value
    while (n < cur_.have.size() && cur_.have[n]) ++n;
    if (n < 2) {
      ++out_.dropped_malformed;
      return;
    }
    cur_.values.resize(n);
    out_.conversations.push_back(std::move(cur_.values));
  }

  std::string path_;
  size_t size_;
  int64_t max_turns_;
  ShareGptFile& out_;
  std::vector<Frame> frames_;
  Entry cur_;
};

std::string read_file(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    throw_usage("--dataset-path " + path + ": no such file (scripts/setup.sh fetches the default ShareGPT file)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_io(path, "cannot open the dataset file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

ShareGptFile read_sharegpt(const std::string& path, int64_t max_turns) {
  const std::string text = read_file(path);
  ShareGptFile out;
  ShareGptSax sax(path, text.size(), std::max<int64_t>(max_turns, 2), out);
  nlohmann::json::sax_parse(text, &sax);
  return out;
}

}  // namespace servetune::datasets

namespace servetune::datasets {

ShareGptFile load_sharegpt(DatasetOptions& o, int64_t max_turns) {
  if (o.path.empty()) o.path = default_sharegpt_path();
  if (o.sharegpt_output_len && *o.sharegpt_output_len <= 0) throw_usage("--sharegpt-output-len must be > 0");
  ShareGptFile file = read_sharegpt(o.path, max_turns);
  if (file.truncated) {
    std::fprintf(stderr, "warning: %s ends inside an entry (a truncated file); using its %lld complete entries\n",
                 o.path.c_str(), static_cast<long long>(file.entries));
  }
  if (!o.disable_shuffle) {
    PyRandom rng(o.seed);
    rng.shuffle(file.conversations);
  }
  return file;
}

nlohmann::json sharegpt_info(const DatasetOptions& o, const ShareGptFile& file, const ShareGptCounts& c) {
  return {{"path", o.path},
          {"entries", file.entries},
          {"truncated_file", file.truncated},
          {"entries_with_2_turns", static_cast<int64_t>(file.conversations.size())},
          {"dropped_malformed_turns", file.dropped_malformed},
          {"examined", c.examined},
          {"filtered_out", c.filtered},
          {"kept", c.kept},
          {"oversampled", c.oversampled},
          {"shuffled", !o.disable_shuffle},
          {"filters",
           {{"min_len", o.sharegpt_min_len},
            {"max_prompt_len", o.sharegpt_max_prompt_len},
            {"max_total_len", o.sharegpt_max_total_len},
            {"output_len_override", o.sharegpt_output_len ? nlohmann::json(*o.sharegpt_output_len) : nlohmann::json()}}}};
}

bool is_valid_sequence(int64_t prompt_len, int64_t output_len, const DatasetOptions& o, bool skip_min_output) {
  return !(prompt_len < o.sharegpt_min_len || (!skip_min_output && output_len < o.sharegpt_min_len) ||
           prompt_len > o.sharegpt_max_prompt_len || prompt_len + output_len > o.sharegpt_max_total_len);
}

}  // namespace servetune::datasets
