// Command-line flags for every EngineConfig setting, one per line of the settings table (engine_settings.inc), spelled
// as SGLang spells them (--tp-size, --max-running-requests, ...); shared by the subcommands that start the engine.
#pragma once

#include <CLI/CLI.hpp>

#include "servetune/engine_config.h"

namespace servetune::cli {

// Adds --model and the engine settings to `cmd`, writing into `config` (which must outlive parsing).
void add_engine_flags(CLI::App* cmd, EngineConfig& config);

}  // namespace servetune::cli
