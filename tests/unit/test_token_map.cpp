// Draft vocabulary files (formats/token_map.h): JSON arrays and plain lists read sorted; every malformed file is an
// error naming the file and what is wrong (PyTorch files with the command that converts them).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/token_map.h"

namespace servetune {
namespace {

std::string write_map(const std::string& text) {
  static int counter = 0;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("servetune_token_map_" + std::to_string(getpid()) + "_" + std::to_string(counter++))).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string error_of(const std::string& text, int64_t vocab = 100) {
  const std::string path = write_map(text);
  try {
    read_token_map(path, vocab);
  } catch (const Error& e) {
    std::filesystem::remove(path);
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    return what;
  }
  std::filesystem::remove(path);
  ADD_FAILURE() << "accepted: " << text;
  return {};
}

TEST(TokenMap, ReadsJsonArraysAndPlainListsSorted) {
  const std::vector<int32_t> expected = {0, 3, 7, 42, 99};
  for (const std::string text : {"[42, 3, 0, 99, 7]\n", "42 3\n0\t99 7", "42,3,0,99,7", " [ 42 ,3,0,99,7 ] "}) {
    const std::string path = write_map(text);
    EXPECT_EQ(read_token_map(path, 100), expected) << text;
    std::filesystem::remove(path);
  }
}

TEST(TokenMap, BadFilesAreClearErrors) {
  EXPECT_NE(error_of("[1, 100]").find("token id 100 is outside the target's vocabulary [0, 100)"), std::string::npos);
  EXPECT_NE(error_of("[1, -2]").find("outside the target's vocabulary"), std::string::npos);
  EXPECT_NE(error_of("[5, 1, 5]").find("token id 5 appears more than once"), std::string::npos);
  EXPECT_NE(error_of("[]").find("holds no token ids"), std::string::npos);
  EXPECT_NE(error_of("").find("holds no token ids"), std::string::npos);
  EXPECT_NE(error_of("[1, 2").find("not closed"), std::string::npos);
  EXPECT_NE(error_of("[[1], [2]]").find("not a flat list"), std::string::npos);
  EXPECT_NE(error_of("[1] 2").find("after the JSON array's end"), std::string::npos);
  EXPECT_NE(error_of("[1, 2.5]").find("'2.' at byte 4 is not a token id"), std::string::npos);
  EXPECT_NE(error_of("{\"ids\": [1]}").find("unexpected '{' at byte 0"), std::string::npos);
  EXPECT_NE(error_of("PK\x03\x04 torch zip").find("is a PyTorch file"), std::string::npos);
  EXPECT_NE(error_of("1 99999999999999999999").find("is not a token id"), std::string::npos);
  try {
    read_token_map("/no/such/token_map.json", 10);
    ADD_FAILURE() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/token_map.json: cannot be read"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune
