// EAGLE draft heads (see eagle_head.h).
#include "model/eagle_head.h"

#include <filesystem>

#include "core/error.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "model/checkpoint.h"
#include "model/hf_weights.h"
#include "model/moe_decoder.h"
#include "model/weight_loader.h"

namespace servetune {
namespace {

// The head's own tensors by their EAGLE names (eagle_fc.* -> fc.*, blk.0.* -> layers.0.*), the embedding and output
// head from the target.
class HeadWeightSource final : public WeightSource {
 public:
  HeadWeightSource(const SafetensorsSet& files, std::string path, const WeightSource& target)
      : files_(files), path_(std::move(path)), target_(target) {}
  const std::string& path() const override { return path_; }

  std::optional<TensorRef> find(const std::string& name) const override {
    if (name == "token_embd.weight" || name == "output.weight") return target_.find(name);
    const std::string own = file_name(name);
    const SafetensorsTensor* t = files_.tensor(own);
    if (t == nullptr) t = files_.tensor("model." + own);  // some heads keep the decoder's prefix
    if (t == nullptr) return std::nullopt;
    return tensor_ref(own, *t);
  }

  std::string file_name(const std::string& name) const override {
    if (name == "token_embd.weight" || name == "output.weight") return target_.file_name(name);
    if (name.starts_with("eagle_fc.")) return name.substr(std::string("eagle_").size());
    std::string hf = hf_tensor_name(name, "llama");
    if (hf.starts_with("model.")) hf = hf.substr(6);
    return hf.empty() ? name : hf;
  }

  void copied(const uint8_t* data, int64_t bytes) const override {
    for (const SafetensorsFile& file : files_.files()) file.drop_pages(data, static_cast<size_t>(bytes));
    target_.copied(data, bytes);
  }
  bool frees_copied() const override { return true; }

 private:
  const SafetensorsSet& files_;
  std::string path_;
  const WeightSource& target_;
};

}  // namespace

EagleHead::EagleHead(const std::string& dir, const Checkpoint& target, Backend& backend, std::span<const int32_t> draft_vocab,
                     bool quantize_q8_0) {
  const std::string config_file = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::is_directory(dir) || !std::filesystem::exists(config_file)) {
    throw_usage("speculative_draft_model '" + dir + "' is not an EAGLE head directory (config.json + safetensors)");
  }
  const HfModelConfig hf = read_hf_config(dir);
  if (!hf.eagle_head) {
    throw_usage("speculative_draft_model " + config_file + " is not an EAGLE head: its architectures should be [" +
                std::string(kEagleHeadArchitecture) + "] (for a whole smaller model use --speculative-algorithm draft)");
  }
  const ModelConfig head = model_config_from_hf(hf, config_file);
  const ModelConfig& t = target.config();
  if (head.hidden != t.hidden || head.vocab != t.vocab) {
    throw_usage("EAGLE head " + dir + " has hidden size " + std::to_string(head.hidden) + " and vocabulary " +
                std::to_string(head.vocab) + ", but the target " + target.path() + " has " + std::to_string(t.hidden) +
                " and " + std::to_string(t.vocab) + ": the head must be trained for this target");
  }
  files_ = std::make_unique<SafetensorsSet>(dir);
  source_ = std::make_unique<HeadWeightSource>(*files_, dir, target.weights());
  WeightLoader loader(*source_, backend, ParallelContext{});
  if (quantize_q8_0) loader.quantize_float_matrices(DType::kQ8_0);
  model_ = MoeDecoderModel::eagle_head(head, loader, backend, draft_vocab);
}

EagleHead::~EagleHead() = default;

}  // namespace servetune
