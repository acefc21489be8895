// External servers: the launch command of a candidate, built from the server's template ({model} {port} {host}
// {flags} and {<setting>}; {{ and }} are literal braces) and its settings rendered as flags: by default
// "--name-with-dashes value", a bare flag for true, nothing for false/null; or as the sweep file's `flags` say
// (a template where {} is the value, null for "this server has no such setting", or a table value -> template).
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tuner/sweep_spec.h"

namespace servetune::tuner {

struct LaunchCommand {
  const ServerSpec* server = nullptr;
  std::string flags;    // rendered flags
  std::string command;  // the full shell command
};

// The server a candidate uses (the `server` setting, or the only one).
const ServerSpec& server_for(const SweepSpec& spec, const nlohmann::ordered_json& settings);

// Renders the command for `settings` (fixed + candidate). Returns nullopt and sets `why` when the server cannot
// express a setting (the candidate is skipped with that reason). Throws Error(kUsage) naming the sweep file for a
// template error (an unknown {placeholder}).
std::optional<LaunchCommand> render_launch(const SweepSpec& spec, const nlohmann::ordered_json& settings, int port,
                                           std::string& why);

// POSIX shell quoting when needed ("abc" stays, "a b" -> 'a b').
std::string shell_quote(const std::string& s);

}  // namespace servetune::tuner
