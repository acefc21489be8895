// libFuzzer target: the safetensors parser must reject any byte string with Error, never crash or read out of
// bounds; whatever it accepts must survive a write/read round trip unchanged.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace servetune;
  const std::span<const uint8_t> input(data, size);
  std::vector<SafetensorsWriteTensor> tensors;
  std::map<std::string, std::string> metadata;
  try {
    SafetensorsFile f(input, "fuzz.safetensors");
    for (const SafetensorsTensor& t : f.tensors()) {
      if (!t.data.empty()) {
        // Views must lie inside the input.
        if (t.data.data() < data || t.data.data() + t.data.size() > data + size) std::abort();
        volatile uint8_t touch = t.data.front() ^ t.data.back();
        (void)touch;
      }
      tensors.push_back({t.name, t.dtype, t.shape, t.data});
    }
    metadata.insert(f.metadata().begin(), f.metadata().end());
  } catch (const Error&) {
    return 0;
  }
  // Accepted input: the writer must take it and the reader must give back the same tensors.
  const std::vector<uint8_t> bytes = safetensors_bytes(tensors, metadata);
  const SafetensorsFile again(bytes, "roundtrip.safetensors");
  if (again.tensors().size() != tensors.size() || again.metadata().size() != metadata.size() ||
      !std::equal(metadata.begin(), metadata.end(), again.metadata().begin())) {
    std::abort();
  }
  for (const SafetensorsWriteTensor& t : tensors) {
    const SafetensorsTensor* back = again.tensor(t.name);
    if (back == nullptr || back->dtype != t.dtype || back->shape != t.shape || back->data.size() != t.data.size() ||
        !std::equal(t.data.begin(), t.data.end(), back->data.begin())) {
      std::abort();
    }
  }
  return 0;
}
