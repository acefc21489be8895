// Draft vocabularies (FR-Spec's "hot tokens", SGLang's --speculative-token-map): the target token ids a draft head
// scores, read from a JSON array or a whitespace/comma-separated list of integers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace servetune {

// The ids in `path`, sorted. Error(kUsage) naming the file when it is missing, not such a list (a PyTorch .pt file,
// SGLang's own format, gets the command that converts it), empty, or holds an id outside [0, vocab) or twice.
std::vector<int32_t> read_token_map(const std::string& path, int64_t vocab);

}  // namespace servetune
