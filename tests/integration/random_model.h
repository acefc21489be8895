// A random-weight model of one of make-model's presets, written to a temporary folder for a test and removed after.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "model/make_model.h"

namespace servetune::testing {

class RandomModel {
 public:
  explicit RandomModel(const std::string& preset)
      : dir_(std::filesystem::temp_directory_path() / ("servetune_tp_" + preset + "_" + std::to_string(::getpid()))) {
    write_random_model(model_preset(preset), dir_.string(), 11, DType::kF32, 0.02f);
  }
  ~RandomModel() { std::filesystem::remove_all(dir_); }
  RandomModel(const RandomModel&) = delete;
  RandomModel& operator=(const RandomModel&) = delete;
  std::string path() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace servetune::testing
