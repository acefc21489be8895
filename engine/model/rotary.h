// The rotary embedding a model applies: RopeParams from its config and the per-frequency factors, when it has any,
// in the backend's memory.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "model/model_config.h"
#include "model/weight_loader.h"

namespace servetune {

class ModelRotary {
 public:
  ModelRotary() = default;
  // The factors are the checkpoint's rope_freqs tensor (as llama.cpp writes llama-3 files), else those the config's
  // scaling implies (model_config.h: rope_freq_factors); read before the loader hands its buffers over.
  ModelRotary(const ModelConfig& config, WeightLoader& loader, Backend& backend);

  // Points at this object's factor buffer: valid while it lives.
  const RopeParams& params() const { return params_; }

 private:
  RopeParams params_;
  std::unique_ptr<Buffer> factors_;
};

}  // namespace servetune
