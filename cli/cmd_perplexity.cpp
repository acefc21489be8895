// `servetune perplexity`: teacher-forced perplexity of the built-in engine, or of an OpenAI-compatible server through
// vLLM's prompt_logprobs (--url), over a fixed text (windowed as llama-perplexity does, loadgen/perplexity.h), and KL
// divergence against a baseline run's saved log-probabilities.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "engine_flags.h"
#include "loadgen/perplexity.h"
#include "loadgen/perplexity_server.h"
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
  loadgen::ServerEndpoint server;  // with --url
  std::string served_model_name;
  std::string tokenizer;
  bool json = false;
  CLI::App* cmd = nullptr;
};

struct Scored {
  size_t text_tokens = 0;
  loadgen::PerplexityResult result;
  std::string cpu_isa;  // the engine's (built-in runs)
};

Scored score_engine(PerplexityCliOptions& o) {
  if (o.engine.model.empty()) throw_usage("--model is required (the model to run; with --url, the served model's name)");
  for (const char* f : {"--served-model-name", "--tokenizer", "--api-key", "--prompt-logprobs", "--request-timeout"}) {
    if (o.cmd->count(f) > 0) throw_usage(std::string(f) + " applies with --url (a server), not to the built-in engine");
  }
  // The KV cache the chunks in flight need, unless the flags size it: reserving the default share of memory would
  // cost more than a short run.
  if (!o.engine.max_total_tokens && o.engine.mem_fraction_static == 0.0) {
    o.engine.max_total_tokens = static_cast<int64_t>(std::max(1, o.run.in_flight)) * (o.run.ctx + o.engine.page_size);
  }
  Engine engine(o.engine);
  const std::string text = loadgen::perplexity_text(o.dataset, o.num_texts, o.seed, engine.tokenizer());
  const std::vector<int32_t> tokens = engine.tokenizer().encode(text, true);
  return {tokens.size(), loadgen::measure_perplexity(engine, tokens, o.run), engine.cpu_isa()};
}

// The server scores token-id prompts made with the local tokenizer (--tokenizer, else --model as a path).
Scored score_server(PerplexityCliOptions& o) {
  reject_engine_flags(o.cmd, "with --url the server runs the model (its own flags set it)");
  if (o.server.top_logprobs < 1) {
    throw_usage("--prompt-logprobs must be at least 1 (top-1 agreement and KL need the most likely token), got " +
                std::to_string(o.server.top_logprobs));
  }
  if (o.engine.model.empty() && o.tokenizer.empty()) throw_usage("--url needs --model (the served model) or --tokenizer");
  const std::string tokenizer_path = o.tokenizer.empty() ? o.engine.model : o.tokenizer;
  const auto tokenizer = load_client_tokenizer(tokenizer_path, o.tokenizer.empty() ? "--model" : "--tokenizer");
  o.server.model = o.served_model_name.empty() ? o.engine.model : o.served_model_name;
  if (const char* k = std::getenv("OPENAI_API_KEY"); o.server.api_key.empty() && k != nullptr) o.server.api_key = k;
  const std::string text = loadgen::perplexity_text(o.dataset, o.num_texts, o.seed, *tokenizer);
  const std::vector<int32_t> tokens = tokenizer->encode(text, true);
  const auto chunks = loadgen::perplexity_chunks(tokens, o.run.ctx, o.run.chunks, tokenizer->add_bos() ? tokenizer->bos_id() : -1);
  const auto scorer = loadgen::make_server_scorer(o.server, tokenizer->vocab_size());
  return {tokens.size(), loadgen::measure_perplexity(*scorer, chunks, o.run), ""};
}

void run_perplexity(PerplexityCliOptions o) {
  const bool server = !o.server.url.empty();
  const Scored s = server ? score_server(o) : score_engine(o);
  const loadgen::PerplexityResult& r = s.result;
  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = o.engine.model;
    if (server) {
      j["url"] = loadgen::completions_url(o.server.url);
      j["prompt_logprobs"] = o.server.top_logprobs;
    }
    j["dataset"] = o.dataset;
    j["text_tokens"] = s.text_tokens;
    j["ctx"] = r.ctx;
    j["chunks"] = r.chunks;
    j["scored_tokens"] = r.scored;
    j["perplexity"] = r.ppl;
    j["perplexity_error"] = r.ppl_error;
    j["running_perplexity"] = r.running_ppl;
    if (r.kl) {
      j["kl_base"] = o.run.kl_base;
      j["kl_top_k"] = r.kl->top_k;
      j["kl_mean"] = r.kl->mean;
      j["kl_median"] = r.kl->median;
      j["kl_p99"] = r.kl->p99;
      j["kl_max"] = r.kl->max;
      j["top1_agreement"] = r.kl->top1_agreement;
      j["base_perplexity"] = r.kl->base_ppl;
      j["delta_perplexity"] = r.kl->delta_ppl;
    }
    if (!server) j["engine_cpu_isa"] = s.cpu_isa;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  if (server) std::printf("server: %s (prompt_logprobs %d)\n", loadgen::completions_url(o.server.url).c_str(), o.server.top_logprobs);
  std::printf("perplexity: %zu tokens, %d chunks of %d (the second half of each scored: %lld tokens)\n", s.text_tokens,
              r.chunks, r.ctx, static_cast<long long>(r.scored));
  for (size_t i = 0; i < r.running_ppl.size(); ++i) std::printf("[%zu]%.4f,", i + 1, r.running_ppl[i]);
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
  if (r.kl) {
    std::printf("Against %s: base PPL %.4f, delta %+.4f (%+.3f%%)\n", o.run.kl_base.c_str(), r.kl->base_ppl, r.kl->delta_ppl,
                100.0 * r.kl->delta_ppl / r.kl->base_ppl);
    std::printf("KL divergence%s: mean %.6f, median %.6f, p99 %.6f, max %.6f; top-1 agreement %.2f%%\n",
                r.kl->top_k ? " (top-K: over the tokens both runs report, the rest lumped)" : "", r.kl->mean, r.kl->median,
                r.kl->p99, r.kl->max, 100.0 * r.kl->top1_agreement);
  }
  if (!o.run.save_logprobs.empty()) std::printf("Saved the log-probabilities to %s\n", o.run.save_logprobs.c_str());
}

void add_perplexity_command(CLI::App& app) {
  auto o = std::make_shared<PerplexityCliOptions>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Teacher-forced perplexity of the built-in engine or a server, and KL against a baseline run");
  o->cmd = cmd;
  add_engine_flags(cmd, o->engine);
  cmd->get_option("--model")->required(false);  // with --url, --tokenizer alone will do (checked when it runs)
  cmd->add_option("--url", o->server.url,
                  "Score an OpenAI-compatible server instead (http://host:port): /v1/completions with vLLM's prompt_logprobs");
  cmd->add_option("--served-model-name", o->served_model_name, "--url: the \"model\" field sent (default: --model)");
  cmd->add_option("--tokenizer", o->tokenizer, "--url: the tokenizer the prompts are made with, .gguf or HF directory (default: --model)");
  cmd->add_option("--api-key", o->server.api_key, "--url: bearer token (default: $OPENAI_API_KEY)");
  cmd->add_option("--prompt-logprobs", o->server.top_logprobs, "--url: K, the top log-probabilities per position asked for (KL uses them)")
      ->capture_default_str();
  cmd->add_option("--request-timeout", o->server.request_timeout_s, "--url: seconds before one chunk's request fails")->capture_default_str();
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
