// Command-line flags for every EngineConfig setting, one per line of the settings table (engine_settings.inc), spelled
// as SGLang spells them (--tp-size, --max-running-requests, ...); shared by the subcommands that start the engine,
// and by those (bench, perplexity) that talk to a server instead, where --model names the served model.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "servetune/engine_config.h"

namespace servetune {
class Tokenizer;
}

namespace servetune::cli {

// The help group of the engine settings (every flag add_engine_flags adds but --model).
inline constexpr const char* kEngineGroup = "Engine settings";

// Adds --model and the engine settings to `cmd`, writing into `config` (which must outlive parsing).
void add_engine_flags(CLI::App* cmd, EngineConfig& config);

// Throws Error(kUsage) naming the first engine setting given on `cmd`, followed by `why` (what runs instead).
void reject_engine_flags(const CLI::App* cmd, const std::string& why);

// The tokenizer a server client makes its prompts with: `path` (a .gguf file or an HF directory) given by `flag`;
// Error(kUsage) when there is nothing at `path` (then --model is likely a served model name without --tokenizer).
std::unique_ptr<Tokenizer> load_client_tokenizer(const std::string& path, const std::string& flag);

}  // namespace servetune::cli
