// Where tests find their data: committed goldens under tests/data, fetched models under models/ (scripts/setup.sh).
// A test that needs a fetched file skips when it is missing, unless SERVETUNE_REQUIRE_MODELS=1 (CI), where it fails.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace servetune::testing {

inline std::string data_path(const std::string& name) { return std::string(SERVETUNE_TEST_DATA_DIR) + "/" + name; }
inline std::string source_path(const std::string& rel) { return std::string(SERVETUNE_SOURCE_DIR) + "/" + rel; }
inline std::string stories_path() { return data_path("stories260K.gguf"); }
inline std::string smollm2_path() { return source_path("models/SmolLM2-135M-Instruct.Q4_1.gguf"); }
inline std::string sharegpt_path() { return source_path("datasets/cache/ShareGPT_V3_unfiltered_cleaned_split.json"); }

// Writes `content` to servetune_test_<name> in the temporary folder and returns its path.
inline std::string temp_file(const std::string& name, const std::string& content) {
  const auto path = std::filesystem::temp_directory_path() / ("servetune_test_" + name);
  std::ofstream(path) << content;
  return path.string();
}

inline bool require_fetched() {
  const char* v = std::getenv("SERVETUNE_REQUIRE_MODELS");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace servetune::testing

// Skips (or fails under SERVETUNE_REQUIRE_MODELS=1) when a file fetched by scripts/setup.sh is absent.
#define SERVETUNE_REQUIRE_FILE(path)                                                        \
  do {                                                                                      \
    if (!std::filesystem::exists(path)) {                                                   \
      if (::servetune::testing::require_fetched()) FAIL() << "missing " << (path) << " (run scripts/setup.sh)"; \
      GTEST_SKIP() << "missing " << (path) << "; run scripts/setup.sh to fetch it";         \
    }                                                                                       \
  } while (0)
