// `servetune import`: other tools' results (vLLM / SGLang stdout and JSON(L), GuideLLM, AIPerf) become records of a
// run folder. Every file is parsed and every record built before anything is written.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servetune::importers {

// One result found in an input file, already in servetune's metric names (vLLM's JSON keys).
struct ImportedResult {
  std::string format;  // vllm-text | sglang-text | vllm-json | sglang-json | guidellm-json | aiperf-json
  int line = 1;        // 1-based line where the block / JSONL line / JSON value starts
  std::string locator;  // where inside the file, e.g. "line 12" or "benchmarks[1]"
  nlohmann::ordered_json metrics = nlohmann::ordered_json::object();   // mean_ttft_ms, output_throughput, ...
  nlohmann::ordered_json workload = nlohmann::ordered_json::object();  // dataset, max_concurrency, request_rate, ...
  nlohmann::ordered_json source = nlohmann::ordered_json::object();    // backend, model, label, date, tool version
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();     // what does not map (record's source_extra)
};

// Detects the format of `text` (read from `path`) and parses every result in it. Throws Error(kFormat) naming
// `path` and the line for malformed or truncated input, or when the file holds no result.
std::vector<ImportedResult> parse_import_text(const std::string& path, const std::string& text);
std::vector<ImportedResult> parse_import_file(const std::string& path);

struct ImportOptions {
  std::vector<std::string> files;
  std::string into;                    // run folder; created when missing
  std::string candidate;               // candidate id; default from --set, the source's label, or the file name
  std::vector<std::string> workloads;  // one name for all results, or one per result in file order
  std::vector<std::string> sets;       // key=value settings of the candidate (engine, version, tp_size, ...)
  bool dry_run = false;
};

struct ImportOutcome {
  std::vector<nlohmann::ordered_json> records;
  std::vector<std::string> paths;  // where each record is (or would be) written
};

// Parses every file, builds the records and checks them against what the folder holds, then writes them (unless
// dry_run) and appends to RUN_DIR/imports.json. Throws Error(kUsage/kFormat/kIo) before writing anything.
ImportOutcome run_import(const ImportOptions& options);

// What RUN_DIR/imports.json says about a folder built by `servetune import`: its baseline (the first candidate
// imported) and the workloads in the order they were first imported. Empty when there is no such file.
struct ImportManifest {
  std::string baseline;
  std::vector<std::string> workloads;
};
ImportManifest read_import_manifest(const std::string& run_dir);

}  // namespace servetune::importers
