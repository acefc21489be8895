// `servetune tokenize --model PATH [--no-special] [--parse-special] TEXT`: prints the token ids of TEXT as a
// JSON array. PATH is a GGUF file or an HF model directory (tokenizer.json).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  bool no_special = false;
  bool parse_special = false;
};

void run_tokenize(const TokenizeOptions& o) {
  if (!std::filesystem::exists(o.model)) throw_usage("--model " + o.model + ": no such file or directory");
  const auto tokenizer = Tokenizer::from_path(o.model);
  std::vector<int32_t> ids = tokenizer->encode(o.text, !o.no_special, o.parse_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fputs(out.c_str(), stdout);
}

void add_tokenize_command(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* sub = app.add_subcommand("tokenize", "print the token ids of a text for a model (JSON array)");
  sub->add_option("--model,-m", opts->model, "GGUF file or HF model directory (tokenizer.json)")->required();
  sub->add_flag("--no-special", opts->no_special, "do not add BOS/EOS (add_special = false)");
  sub->add_flag("--parse-special", opts->parse_special, "text spelling a control token becomes that token");
  sub->add_option("text", opts->text, "the text to tokenize")->required();
  sub->callback([opts] { run_tokenize(*opts); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(20, add_tokenize_command);

}  // namespace servetune::cli
