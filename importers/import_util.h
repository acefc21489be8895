// Shared pieces of the importers (see importer.h): metric-name mapping onto vLLM's JSON keys, number parsing,
// per-format parsers and the checks every imported result must pass.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "importers/importer.h"

namespace servetune::importers::import_detail {

// "TTFT", "ttft", "E2E Latency", "e2e_latency", "E2EL" ... -> "ttft" / "e2el" ...; "" when unknown.
std::string latency_name(const std::string& name);
// "Mean", "median", "P99", "p99.9", "Std", "Max" -> "mean", "median", "p99", "p99.9", "std", "max"; "" when not a stat.
std::string stat_name(const std::string& word);
// Lower-case, runs of other characters become '_': "Accept length" -> "accept_length".
std::string slug(const std::string& label);
// A whole-string decimal number (leading/trailing blanks allowed); nullopt otherwise.
std::optional<double> parse_number(const std::string& s);
// An integer-valued double as an integer JSON value, else the double.
nlohmann::ordered_json number_json(double v);
std::string lower(std::string s);

// Fills total_token_throughput when it can be derived and checks the metrics a report needs; throws
// Error(kFormat) "PATH: WHERE: ..." when one is missing or not a finite number.
void finish_result(ImportedResult& r, const std::string& path);

// The per-format parsers (import_text.cpp, import_json.cpp, import_tools.cpp).
std::vector<ImportedResult> parse_text_blocks(const std::string& path, const std::string& text);
std::vector<ImportedResult> parse_json_document(const std::string& path, const std::string& text);
std::vector<ImportedResult> parse_flat_result(const nlohmann::ordered_json& j, const std::string& path, int line,
                                              const std::string& locator);
std::vector<ImportedResult> parse_guidellm(const nlohmann::ordered_json& j, const std::string& path, int line);
std::vector<ImportedResult> parse_aiperf(const nlohmann::ordered_json& j, const std::string& path, int line);
bool looks_like_guidellm(const nlohmann::ordered_json& j);
bool looks_like_aiperf(const nlohmann::ordered_json& j);

}  // namespace servetune::importers::import_detail
