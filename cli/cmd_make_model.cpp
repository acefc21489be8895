// `servetune make-model`: writes a random-weight checkpoint (safetensors + config.json + tokenizer.json) of a named
// preset (llama-family, or mixture-of-experts / latent-attention) or an explicit llama-family shape, for tests and
// benchmarks.
#include <cstdio>

#include "commands.h"
#include "servetune/error.h"
#include "servetune/make_model.h"

namespace servetune::cli {
namespace {

struct MakeModelOptions {
  std::string arch = "llama";
  std::string preset;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, intermediate = 0, vocab = 0, context = 4096;
  double rope_theta = 10000.0;
  bool tie = false;
  std::string out;
  std::string dtype = "f32";
  uint64_t seed = 0;
  float init_std = 0.02f;
};

WeightDType parse_dtype(const std::string& name) {
  if (name == "f32") return WeightDType::kF32;
  if (name == "bf16") return WeightDType::kBF16;
  if (name == "f16") return WeightDType::kF16;
  throw_usage("--dtype must be f32, f16 or bf16");
}

void run_make_model(const MakeModelOptions& o) {
  const WeightDType dtype = parse_dtype(o.dtype);
  RandomModelSummary written;
  if (!o.preset.empty()) {
    written = make_random_model(o.preset, o.out, o.seed, dtype, o.init_std);
  } else {
    if (o.layers <= 0 || o.hidden <= 0 || o.heads <= 0 || o.intermediate <= 0 || o.vocab <= 0) {
      throw_usage("give --preset NAME, or all of --layers --hidden --heads --intermediate --vocab");
    }
    if (o.arch != "llama" && o.arch != "qwen2") throw_usage("--arch must be llama or qwen2");
    if (o.hidden % o.heads != 0) throw_usage("--hidden must be a multiple of --heads");
    const int64_t kv = o.kv_heads > 0 ? o.kv_heads : o.heads;
    if (o.heads % kv != 0) throw_usage("--heads must be a multiple of --kv-heads");
    RandomModelShape shape;
    shape.arch = o.arch;
    shape.layers = o.layers;
    shape.hidden = o.hidden;
    shape.heads = o.heads;
    shape.kv_heads = kv;
    shape.intermediate = o.intermediate;
    shape.vocab = o.vocab;
    shape.context = o.context;
    shape.rope_theta = o.rope_theta;
    shape.tie_embeddings = o.tie;
    written = make_random_model(shape, o.out, o.seed, dtype, o.init_std);
  }
  std::printf("wrote %s (%s, %lld layers, hidden %lld, vocab %lld, %s)\n", o.out.c_str(), written.architecture.c_str(),
              static_cast<long long>(written.layers), static_cast<long long>(written.hidden),
              static_cast<long long>(written.vocab), o.dtype.c_str());
}

void add_make_model_command(CLI::App& app) {
  auto o = std::make_shared<MakeModelOptions>();
  CLI::App* cmd = app.add_subcommand("make-model", "Write a random-weight model (safetensors + config.json + tokenizer.json)");
  std::string presets;
  for (const auto& n : model_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  cmd->add_option("--preset", o->preset, "Named shape: " + presets);
  cmd->add_option("--arch", o->arch, "llama | qwen2 (with explicit shapes)");
  cmd->add_option("--layers", o->layers);
  cmd->add_option("--hidden", o->hidden);
  cmd->add_option("--heads", o->heads);
  cmd->add_option("--kv-heads", o->kv_heads, "Default: --heads");
  cmd->add_option("--intermediate", o->intermediate);
  cmd->add_option("--vocab", o->vocab);
  cmd->add_option("--context", o->context, "max_position_embeddings");
  cmd->add_option("--rope-theta", o->rope_theta);
  cmd->add_flag("--tie-embeddings", o->tie);
  cmd->add_option("--dtype", o->dtype, "f32 | f16 | bf16")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Weights are deterministic in (shape, seed)");
  cmd->add_option("--init-std", o->init_std, "Standard deviation of the weights")->capture_default_str();
  cmd->add_option("--out,--output,-o", o->out, "Output directory")->required();
  cmd->callback([o] { run_make_model(*o); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(90, add_make_model_command);

}  // namespace servetune::cli
