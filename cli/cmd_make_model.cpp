// `servetune make-model`: writes a random-weight llama-family checkpoint (safetensors + config.json + tokenizer.json)
// of a named preset or explicit shape, for tests and benchmarks.
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "model/make_model.h"

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

void run_make_model(const MakeModelOptions& o) {
  HfModelConfig c;
  if (!o.preset.empty()) {
    c = model_preset(o.preset);
  } else {
    if (o.layers <= 0 || o.hidden <= 0 || o.heads <= 0 || o.intermediate <= 0 || o.vocab <= 0) {
      throw_usage("give --preset NAME, or all of --layers --hidden --heads --intermediate --vocab");
    }
    if (o.arch != "llama" && o.arch != "qwen2") throw_usage("--arch must be llama or qwen2");
    if (o.hidden % o.heads != 0) throw_usage("--hidden must be a multiple of --heads");
    const int64_t kv = o.kv_heads > 0 ? o.kv_heads : o.heads;
    if (o.heads % kv != 0) throw_usage("--heads must be a multiple of --kv-heads");
    c.model_type = o.arch;
    c.architecture = o.arch == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    c.num_hidden_layers = o.layers;
    c.hidden_size = o.hidden;
    c.num_attention_heads = o.heads;
    c.num_key_value_heads = kv;
    c.head_dim = o.hidden / o.heads;
    c.intermediate_size = o.intermediate;
    c.vocab_size = o.vocab;
    c.max_position_embeddings = o.context;
    c.rope_theta = o.rope_theta;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = o.tie;
    c.attention_bias = o.arch == "qwen2";
    c.bos_token_id = {1};
    c.eos_token_id = {2};
  }
  DType dtype = DType::kF32;
  if (o.dtype == "bf16") dtype = DType::kBF16;
  else if (o.dtype == "f16") dtype = DType::kF16;
  else if (o.dtype != "f32") throw_usage("--dtype must be f32, f16 or bf16");
  write_random_model(c, o.out, o.seed, dtype, o.init_std);
  std::printf("wrote %s (%s, %lld layers, hidden %lld, vocab %lld, %s)\n", o.out.c_str(), c.architecture.c_str(),
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.vocab_size), o.dtype.c_str());
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
  cmd->add_option("--out,-o", o->out, "Output directory")->required();
  cmd->callback([o] { run_make_model(*o); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(90, add_make_model_command);

}  // namespace servetune::cli
