// libFuzzer target: the GGUF parser must reject any byte string with Error, never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    servetune::GgufFile f(std::span<const uint8_t>(data, size), "fuzz.gguf");
    uint64_t sum = 0;
    for (const auto& t : f.tensors()) {
      if (t.n_bytes > 0) sum += t.data[0] + t.data[t.n_bytes - 1];  // touch first and last byte of every tensor
    }
    for (const auto& [key, value] : f.metadata()) {
      if (value.is_array() && value.size() > 0) (void)value.at(value.size() - 1);
    }
    (void)sum;
  } catch (const servetune::Error&) {
  }
  return 0;
}
