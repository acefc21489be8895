// Every setting of the built-in engine, named as SGLang names them, declared once in engine_settings.inc; the struct,
// JSON (strict), the key list, the CLI flags, sweep-file checks and reproduce commands all come from that table.
// Settings not implemented yet are rejected by validate(), never silently ignored.
//
// The table is an X-macro list rather than a constexpr array: the struct's members themselves are generated from it
// (a table of member pointers cannot declare them), and each line keeps its member's static type, so JSON and CLI11
// read and write typed values (enums included) with no string dispatch. Rules across settings stay in validate().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "servetune/engine_setting_enums.h"

namespace servetune {

struct EngineConfig {
#define SERVETUNE_ENGINE_SETTING(name, type, value, flags, help) type name = value;
#include "servetune/engine_settings.inc"
#undef SERVETUNE_ENGINE_SETTING

  // Throws Error(kUsage) for a bad value and Error(kUnsupported) for a setting this build cannot honour yet.
  void validate() const;
  // The rules that combine settings with each other and with this machine (tp_size x dp_size ranks need that many
  // threads, KV capacity must leave every replica a page, ...): "" when they hold, else what is wrong. validate()
  // throws it as Error(kUsage); the tuner skips such candidates with this message.
  std::string combination_problem() const;
  // The part of combination_problem() about where the tensor-parallel ranks run (comm_backend, nnodes, node_rank,
  // dist_init_addr).
  std::string placement_problem() const;
};

// One line of the table, as data.
struct EngineSetting {
  std::string_view key;    // JSON key, sweep-file name and member name
  std::string_view flags;  // CLI11 names, SGLang's spelling ("--tp-size", "--model,-m")
  std::string_view help;
  std::vector<std::string_view> words;  // an enum setting's spellings ("" included where it means none); else empty

  // The long flag, as reproduce commands write it ("--random-seed" for seed).
  std::string_view flag() const;
};

// The table in order.
const std::vector<EngineSetting>& engine_settings();
// nullptr for a name that is no setting.
const EngineSetting* find_engine_setting(std::string_view key);
// All setting names, in table order.
const std::vector<std::string>& engine_config_keys();

// Calls f(setting, member) for each table line, in order; `Config` is EngineConfig or const EngineConfig.
template <typename Config, typename F>
  requires std::is_same_v<std::remove_const_t<Config>, EngineConfig>
void for_each_setting(Config& config, F&& f) {
  const EngineSetting* setting = engine_settings().data();
#define SERVETUNE_ENGINE_SETTING(name, type, value, flags, help) f(*setting++, config.name);
#include "servetune/engine_settings.inc"
#undef SERVETUNE_ENGINE_SETTING
}

// Every setting, in table order (nlohmann::json sorts the keys). Enums as their words, unset optionals as null.
void to_json(nlohmann::json& j, const EngineConfig& c);
void to_json(nlohmann::ordered_json& j, const EngineConfig& c);
// Missing keys keep their defaults; unknown keys, wrong types and unknown enum words are Error(kUsage) naming the key.
void from_json(const nlohmann::json& j, EngineConfig& c);
void from_json(const nlohmann::ordered_json& j, EngineConfig& c);

// Whether `value` is a valid value of setting `key` on its own (type, range of the member, enum word): Error(kUsage)
// naming the key otherwise. For sweep files, before any candidate is built.
void check_engine_setting(const std::string& key, const nlohmann::ordered_json& value);

}  // namespace servetune
