// Engine setting flags (see engine_flags.h): one CLI11 option per line of the settings table, typed by its member.
#include "engine_flags.h"

#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>

#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::cli {
namespace {

// "auto | gguf | safetensors | dummy" (a word that is "" means none, which is the default).
std::string word_list(const EngineSetting& s) {
  std::string out;
  for (const std::string_view w : s.words) {
    if (!w.empty()) out += (out.empty() ? "" : " | ") + std::string(w);
  }
  return out;
}

template <typename T>
CLI::Option* add_setting(CLI::App* cmd, const EngineSetting& s, T& member) {
  const std::string flags(s.flags), help(s.help);
  if constexpr (std::is_same_v<T, bool>) {
    return cmd->add_flag(flags, member, help);
  } else if constexpr (SettingEnumType<T>) {
    // Parsed here, once: a bad word is Error(kUsage) naming the setting and the words it takes.
    const auto parse = [&member](const std::string& text) { member = parse_setting_enum<T>(text); };
    return cmd->add_option_function<std::string>(flags, parse, word_list(s) + " (" + help + ")")
        ->type_name("TEXT")
        ->default_str(to_string(member));
  } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
    return cmd->add_option(flags, member, help);  // unset by default: nothing to show
  } else {
    return cmd->add_option(flags, member, help)->capture_default_str();
  }
}

}  // namespace

void add_engine_flags(CLI::App* cmd, EngineConfig& c) {
  for_each_setting(c, [&](const EngineSetting& s, auto& member) {
    CLI::Option* option = add_setting(cmd, s, member);
    if (s.key == "model") {
      option->required();
    } else {
      option->group(kEngineGroup);
    }
  });
}

void reject_engine_flags(const CLI::App* cmd, const std::string& why) {
  for (const CLI::Option* opt : cmd->get_options()) {
    if (opt->get_group() == kEngineGroup && opt->count() > 0) throw_usage(opt->get_name() + " is an engine setting; " + why);
  }
}

std::unique_ptr<Tokenizer> load_client_tokenizer(const std::string& path, const std::string& flag) {
  if (!std::filesystem::exists(path)) {
    throw_usage(flag + " " + path + ": no such file or directory (a .gguf file or an HF directory with tokenizer.json;"
                " give --tokenizer PATH when --model is a served model name)");
  }
  return Tokenizer::from_path(path);
}

}  // namespace servetune::cli
