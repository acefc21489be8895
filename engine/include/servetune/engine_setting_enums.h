// The enum-valued engine settings and their one spelling table each: JSON, the CLI and messages use these words,
// the code compares enums. Text is parsed once, at the boundary (JSON, flags); a bad word is Error(kUsage) naming the
// setting and the words it accepts. Depends on nothing, so internal layers (scheduler, checkpoint) use these types.
#pragma once

#include <array>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>

namespace servetune {

enum class LoadFormat { kAuto, kGguf, kSafetensors, kDummy };
enum class Device { kCpu, kCuda, kHip };
enum class LoadBalanceMethod { kRoundRobin, kShortestQueue };
enum class CommBackend { kLocal, kGloo, kNccl };
enum class MoeA2aBackend { kNone, kDeepep };
enum class CompileLevel { kEager, kFused, kGraphs };
enum class KvCacheDtype { kAuto, kF32, kF16, kBf16, kFp8E4m3 };
enum class SchedulePolicy { kFcfs, kLpm };
enum class SpeculativeAlgorithm { kNone, kNgram, kDraft, kEagle, kMtp };
enum class DraftModelQuantization { kNone, kQ8_0 };

template <typename E>
struct EnumSpelling {
  E value;
  std::string_view text;
};

// Per enum: the setting it belongs to (for messages), whether its words are read in any case, and its spellings.
template <typename E>
struct SettingEnum;

template <>
struct SettingEnum<LoadFormat> {
  static constexpr std::string_view kKey = "load_format";
  static constexpr bool kAnyCase = false;
  static constexpr std::array<EnumSpelling<LoadFormat>, 4> kSpellings = {{{LoadFormat::kAuto, "auto"},
                                                                          {LoadFormat::kGguf, "gguf"},
                                                                          {LoadFormat::kSafetensors, "safetensors"},
                                                                          {LoadFormat::kDummy, "dummy"}}};
};

template <>
struct SettingEnum<Device> {
  static constexpr std::string_view kKey = "device";
  static constexpr bool kAnyCase = false;
  static constexpr std::array<EnumSpelling<Device>, 3> kSpellings = {
      {{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}, {Device::kHip, "hip"}}};
};

template <>
struct SettingEnum<LoadBalanceMethod> {
  static constexpr std::string_view kKey = "load_balance_method";
  static constexpr bool kAnyCase = false;
  static constexpr std::array<EnumSpelling<LoadBalanceMethod>, 2> kSpellings = {
      {{LoadBalanceMethod::kRoundRobin, "round_robin"}, {LoadBalanceMethod::kShortestQueue, "shortest_queue"}}};
};

template <>
struct SettingEnum<CommBackend> {
  static constexpr std::string_view kKey = "comm_backend";
  static constexpr bool kAnyCase = false;
  static constexpr std::array<EnumSpelling<CommBackend>, 3> kSpellings = {
      {{CommBackend::kLocal, "local"}, {CommBackend::kGloo, "gloo"}, {CommBackend::kNccl, "nccl"}}};
};

// SGLang's --moe-a2a-backend words: none (tokens gathered to every rank) | deepep (dispatched all-to-all to the ranks
// owning their experts, as DeepEP does; here over the engine's own communicator, not the DeepEP library).
template <>
struct SettingEnum<MoeA2aBackend> {
  static constexpr std::string_view kKey = "moe_a2a_backend";
  static constexpr bool kAnyCase = false;
  static constexpr std::array<EnumSpelling<MoeA2aBackend>, 2> kSpellings = {
      {{MoeA2aBackend::kNone, "none"}, {MoeA2aBackend::kDeepep, "deepep"}}};
};

template <>
struct SettingEnum<CompileLevel> {
  static constexpr std::string_view kKey = "compile";
  static constexpr bool kAnyCase = false;
  static constexpr std::array<EnumSpelling<CompileLevel>, 3> kSpellings = {
      {{CompileLevel::kEager, "eager"}, {CompileLevel::kFused, "fused"}, {CompileLevel::kGraphs, "graphs"}}};
};

template <>
struct SettingEnum<KvCacheDtype> {
  static constexpr std::string_view kKey = "kv_cache_dtype";
  static constexpr bool kAnyCase = false;
  static constexpr std::array<EnumSpelling<KvCacheDtype>, 5> kSpellings = {{{KvCacheDtype::kAuto, "auto"},
                                                                            {KvCacheDtype::kF32, "f32"},
                                                                            {KvCacheDtype::kF16, "f16"},
                                                                            {KvCacheDtype::kBf16, "bf16"},
                                                                            {KvCacheDtype::kFp8E4m3, "fp8_e4m3"}}};
};

template <>
struct SettingEnum<SchedulePolicy> {
  static constexpr std::string_view kKey = "schedule_policy";
  static constexpr bool kAnyCase = false;
  static constexpr std::array<EnumSpelling<SchedulePolicy>, 2> kSpellings = {
      {{SchedulePolicy::kFcfs, "fcfs"}, {SchedulePolicy::kLpm, "lpm"}}};
};

// SGLang spells these in capitals (EAGLE, NGRAM), so any case is read; "" is no speculation.
template <>
struct SettingEnum<SpeculativeAlgorithm> {
  static constexpr std::string_view kKey = "speculative_algorithm";
  static constexpr bool kAnyCase = true;
  static constexpr std::array<EnumSpelling<SpeculativeAlgorithm>, 5> kSpellings = {
      {{SpeculativeAlgorithm::kNone, ""},
       {SpeculativeAlgorithm::kNgram, "ngram"},
       {SpeculativeAlgorithm::kDraft, "draft"},
       {SpeculativeAlgorithm::kEagle, "eagle"},
       {SpeculativeAlgorithm::kMtp, "mtp"}}};
};

// "" keeps the draft head's weights as stored.
template <>
struct SettingEnum<DraftModelQuantization> {
  static constexpr std::string_view kKey = "speculative_draft_model_quantization";
  static constexpr bool kAnyCase = true;
  static constexpr std::array<EnumSpelling<DraftModelQuantization>, 2> kSpellings = {
      {{DraftModelQuantization::kNone, ""}, {DraftModelQuantization::kQ8_0, "q8_0"}}};
};

template <typename E>
concept SettingEnumType = requires { SettingEnum<E>::kSpellings; };

// The enum's word ("gloo").
template <SettingEnumType E>
std::string to_string(E value) {
  for (const auto& s : SettingEnum<E>::kSpellings) {
    if (s.value == value) return std::string(s.text);
  }
  return "?";
}

// The value `text` spells, or nullopt.
template <SettingEnumType E>
std::optional<E> enum_from_text(std::string_view text) {
  const auto same = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      const auto x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
      if (SettingEnum<E>::kAnyCase ? std::tolower(x) != std::tolower(y) : x != y) return false;
    }
    return true;
  };
  for (const auto& s : SettingEnum<E>::kSpellings) {
    if (same(s.text, text)) return s.value;
  }
  return std::nullopt;
}

// The words for messages: "eager, fused or graphs" ("ngram, draft, eagle or mtp (or empty)" where "" is one).
template <SettingEnumType E>
std::string allowed_words() {
  std::string out;
  bool empty = false;
  size_t left = SettingEnum<E>::kSpellings.size();
  for (const auto& s : SettingEnum<E>::kSpellings) {
    --left;
    if (s.text.empty()) {
      empty = true;
      continue;
    }
    out += std::string(out.empty() ? "" : (left == 0 ? " or " : ", ")) + std::string(s.text);
  }
  return empty ? out + " (or empty)" : out;
}

// Throws Error(kUsage): "compile must be eager, fused or graphs, got 'fusd'".
[[noreturn]] void throw_bad_word(std::string_view key, const std::string& allowed, std::string_view text);

// Parses `text` or throws Error(kUsage) naming the setting and its words.
template <SettingEnumType E>
E parse_setting_enum(std::string_view text) {
  if (const auto v = enum_from_text<E>(text)) return *v;
  throw_bad_word(SettingEnum<E>::kKey, allowed_words<E>(), text);
}

inline LoadFormat parse_load_format(std::string_view text) { return parse_setting_enum<LoadFormat>(text); }
inline Device parse_device(std::string_view text) { return parse_setting_enum<Device>(text); }
inline LoadBalanceMethod parse_load_balance_method(std::string_view text) {
  return parse_setting_enum<LoadBalanceMethod>(text);
}
inline CommBackend parse_comm_backend(std::string_view text) { return parse_setting_enum<CommBackend>(text); }
inline MoeA2aBackend parse_moe_a2a_backend(std::string_view text) { return parse_setting_enum<MoeA2aBackend>(text); }
inline CompileLevel parse_compile_level(std::string_view text) { return parse_setting_enum<CompileLevel>(text); }
inline KvCacheDtype parse_kv_cache_dtype(std::string_view text) { return parse_setting_enum<KvCacheDtype>(text); }
inline SchedulePolicy parse_schedule_policy(std::string_view text) { return parse_setting_enum<SchedulePolicy>(text); }
inline SpeculativeAlgorithm parse_speculative_algorithm(std::string_view text) {
  return parse_setting_enum<SpeculativeAlgorithm>(text);
}
inline DraftModelQuantization parse_draft_model_quantization(std::string_view text) {
  return parse_setting_enum<DraftModelQuantization>(text);
}

}  // namespace servetune
