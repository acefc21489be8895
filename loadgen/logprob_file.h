// The log-probability file `servetune perplexity --save-logprobs` writes and --kl-base (and a sweep's accuracy
// baseline) reads: the run's shape and chunk tokens, then every scored position in order. Two layouts, by magic:
//   "STLOGP01" (whole rows, the built-in engine): int32 ctx, vocab, chunks; chunks x ctx int32 tokens; per position
//              vocab f32 log-probabilities.
//   "STLOGP02" (top-K, a server's prompt_logprobs): the same header and tokens; per position f64 the target's
//              log-probability, int32 n, then n x (int32 token, f32 log-probability), by token id.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "loadgen/position_logprobs.h"

namespace servetune::loadgen {

struct LogprobShape {
  int32_t ctx = 0, vocab = 0;
  std::vector<std::vector<int32_t>> chunks;  // the chunks' tokens
};

class LogprobWriter {
 public:
  // Throws Error(kIo) naming `path` when it cannot be written.
  LogprobWriter(std::string path, const LogprobShape& shape, bool dense);
  void write(const PositionLogprobs& p);
  void finish();  // flushes; throws Error(kIo) when the writes failed

 private:
  std::string path_;
  bool dense_;
  std::ofstream out_;
};

class LogprobReader {
 public:
  // Opens `path` and checks it scored the same tokens as `shape` (and, when both are whole rows, over the same
  // vocabulary); throws Error(kIo) when it cannot be read and Error(kUsage) naming it when it does not match.
  LogprobReader(std::string path, const LogprobShape& shape, bool run_dense);
  // The next scored position, whose next token is `target`. Throws Error(kUsage) when the file ends early.
  PositionLogprobs next(int32_t target);

 private:
  std::string path_;
  bool dense_ = true;
  int32_t vocab_ = 0;
  std::ifstream in_;
};

}  // namespace servetune::loadgen
