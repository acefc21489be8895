// WeightSource implementations over parsed checkpoint files.
#include "model/weight_source.h"

#include <algorithm>

#include "formats/gguf.h"

namespace servetune {

int64_t TensorRef::rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
  return r;
}

const std::string& GgufWeightSource::path() const { return file_.path(); }

std::optional<TensorRef> GgufWeightSource::find(const std::string& name) const {
  const GgufTensorInfo* t = file_.tensor(name);
  if (t == nullptr) return std::nullopt;
  TensorRef ref;
  ref.name = t->name;
  ref.type = t->dtype;
  ref.shape.assign(t->dims.rbegin(), t->dims.rend());
  ref.data = t->data;
  ref.n_bytes = t->n_bytes;
  return ref;
}

void GgufWeightSource::copied(const uint8_t* data, int64_t bytes) const {
  file_.drop_pages(data, static_cast<size_t>(bytes));
}

}  // namespace servetune
