// `servetune perplexity`: teacher-forced perplexity of the built-in engine over a fixed text (windowed as
// llama-perplexity does, loadgen/perplexity.h), and KL divergence against a baseline run's saved log-probabilities.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "engine_flags.h"
#include "loadgen/perplexity.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::cli {
namespace {

struct PerplexityCliOptions {
  EngineConfig engine;
  std::string dataset = "sharegpt";
  int64_t num_texts = 200;
  uint64_t seed = 0;
  loadgen::PerplexityOptions run;
  bool json = false;
};

void run_perplexity(PerplexityCliOptions o) {
  // The KV cache the chunks in flight need, unless the flags size it: reserving the default share of memory would
  // cost more than a short run.
  if (!o.engine.max_total_tokens && o.engine.mem_fraction_static == 0.0) {
    o.engine.max_total_tokens = static_cast<int64_t>(std::max(1, o.run.in_flight)) * (o.run.ctx + o.engine.page_size);
  }
  Engine engine(o.engine);
  const std::string text = loadgen::perplexity_text(o.dataset, o.num_texts, o.seed, engine.tokenizer());
  const std::vector<int32_t> tokens = engine.tokenizer().encode(text, true);
  const loadgen::PerplexityResult r = loadgen::measure_perplexity(engine, tokens, o.run);
  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = o.engine.model;
    j["dataset"] = o.dataset;
    j["text_tokens"] = tokens.size();
    j["ctx"] = r.ctx;
    j["chunks"] = r.chunks;
    j["scored_tokens"] = r.scored;
    j["perplexity"] = r.ppl;
    j["perplexity_error"] = r.ppl_error;
    j["running_perplexity"] = r.running_ppl;
    if (r.kl) {
      j["kl_base"] = o.run.kl_base;
      j["kl_mean"] = r.kl->mean;
      j["kl_median"] = r.kl->median;
      j["kl_p99"] = r.kl->p99;
      j["kl_max"] = r.kl->max;
      j["top1_agreement"] = r.kl->top1_agreement;
      j["base_perplexity"] = r.kl->base_ppl;
      j["delta_perplexity"] = r.kl->delta_ppl;
    }
    j["engine_cpu_isa"] = engine.cpu_isa();
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("perplexity: %zu tokens, %d chunks of %d (the second half of each scored: %lld tokens)\n", tokens.size(),
              r.chunks, r.ctx, static_cast<long long>(r.scored));
  for (size_t i = 0; i < r.running_ppl.size(); ++i) std::printf("[%zu]%.4f,", i + 1, r.running_ppl[i]);
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
  if (r.kl) {
    std::printf("Against %s: base PPL %.4f, delta %+.4f (%+.3f%%)\n", o.run.kl_base.c_str(), r.kl->base_ppl, r.kl->delta_ppl,
                100.0 * r.kl->delta_ppl / r.kl->base_ppl);
    std::printf("KL divergence: mean %.6f, median %.6f, p99 %.6f, max %.6f; top-1 agreement %.2f%%\n", r.kl->mean, r.kl->median,
                r.kl->p99, r.kl->max, 100.0 * r.kl->top1_agreement);
  }
  if (!o.run.save_logprobs.empty()) std::printf("Saved the log-probabilities to %s\n", o.run.save_logprobs.c_str());
}

void add_perplexity_command(CLI::App& app) {
  auto o = std::make_shared<PerplexityCliOptions>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Teacher-forced perplexity of the built-in engine, and KL against a baseline run");
  add_engine_flags(cmd, o->engine);
  cmd->add_option("--dataset", o->dataset, "sharegpt (its first human turns), a ShareGPT .json file, or a plain text file")
      ->capture_default_str();
  cmd->add_option("--num-texts", o->num_texts, "ShareGPT: how many turns make the text")->capture_default_str();
  cmd->add_option("--seed", o->seed, "ShareGPT: the sample's seed")->capture_default_str();
  cmd->add_option("--ctx", o->run.ctx, "Tokens per chunk (llama-perplexity's -c); the second half is scored")->capture_default_str();
  cmd->add_option("--chunks", o->run.chunks, "At most this many chunks (-1: all)")->capture_default_str();
  cmd->add_option("--save-logprobs", o->run.save_logprobs, "Write the scored positions' log-probabilities (a baseline for --kl-base)");
  cmd->add_option("--kl-base", o->run.kl_base, "KL divergence, top-1 agreement and delta PPL against a --save-logprobs file");
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  cmd->callback([o] { run_perplexity(*o); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(45, add_perplexity_command);

}  // namespace servetune::cli
