// Registration of servetune's subcommands on the CLI11 app; each lives in its own cmd_*.cpp.
// A subcommand's callback runs the command and throws servetune::Error on failure (main maps it to an exit code).
#pragma once

#include <CLI/CLI.hpp>

namespace servetune::cli {

// Each adds one subcommand to `app`.
// (Subcommands are listed here only once they work.)

}  // namespace servetune::cli
