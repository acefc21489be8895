// Subcommand registry: each cmd_*.cpp registers a function that adds its subcommand to the CLI11 app.
// A subcommand's callback throws servetune::Error on failure; main maps it to an exit code (1, or 2 for usage).
#pragma once

#include <CLI/CLI.hpp>

namespace servetune::cli {

using AddCommand = void (*)(CLI::App& app);

// Registers `add` to run at start-up; `order` sorts the subcommands in --help.
struct CommandRegistration {
  CommandRegistration(int order, AddCommand add);
};

void add_all_commands(CLI::App& app);

}  // namespace servetune::cli

#define SERVETUNE_REGISTER_COMMAND(order, fn) \
  static const ::servetune::cli::CommandRegistration servetune_command_registration_##fn(order, fn)
