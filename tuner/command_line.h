// Command lines that reproduce a candidate: the built-in engine's settings as SGLang-named flags
// (`servetune serve --model M --max-running-requests 32 ...`), and `servetune bench` flags for a workload
// (vllm bench serve's names), so a report's conclusion can be pasted into a shell.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace servetune::tuner {

// Flags for the built-in engine settings that differ from the defaults ("--max-running-requests 32 ...").
std::string engine_flags(const nlohmann::ordered_json& settings);
// `servetune bench` flags for a workload description (a record's "workload").
std::string bench_flags(const nlohmann::ordered_json& workload);

}  // namespace servetune::tuner
