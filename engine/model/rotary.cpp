// ModelRotary: a model's rotary parameters and frequency factors (see rotary.h).
#include "model/rotary.h"

#include <vector>

namespace servetune {

ModelRotary::ModelRotary(const ModelConfig& config, WeightLoader& loader, Backend& backend) {
  std::vector<float> factors;
  if (loader.has("rope_freqs.weight")) {
    const float* ff = loader.vector("rope_freqs.weight", config.rope_dim / 2);
    factors.assign(ff, ff + config.rope_dim / 2);
  } else {
    factors = rope_freq_factors(config);
  }
  params_.head_dim = config.head_dim;
  params_.rope_dim = config.rope_dim;
  params_.theta = config.rope_theta;
  params_.freq_scale = config.rope_scaling == RopeKind::kLinear ? 1.0f / config.rope_factor : 1.0f;
  params_.neox = config.rope_neox;
  if (!factors.empty()) {
    const size_t bytes = factors.size() * sizeof(float);
    factors_ = backend.allocate(bytes);
    backend.upload(*factors_, 0, factors.data(), bytes);
    params_.freq_factors = static_cast<const float*>(factors_->data());
  }
}

}  // namespace servetune
