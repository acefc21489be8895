// `servetune generate`: runs the built-in engine on one prompt, streams the text, then prints prefill and decode
// speed (or, with --json, the prompt and output ids, text and finish reason). --warmup runs the prompt untimed first
// (kernel set-up, allocations and graph captures out of the timed run) and forgets it from the prefix cache.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "engine_flags.h"
#include "servetune/engine.h"
#include "servetune/error.h"
#include "servetune/tokenizer.h"

namespace servetune::cli {
namespace {

struct GenerateOptions {
  EngineConfig engine;
  std::string prompt;
  std::string chat;
  std::string system;
  int max_tokens = 128;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool json = false;
  bool no_parse_special = false;
  int warmup = 0;
};

double ms_between(EngineClock::time_point a, EngineClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void run_generate(const GenerateOptions& o) {
  if (o.prompt.empty() == o.chat.empty()) throw_usage("give exactly one of --prompt TEXT or --chat TEXT");
  Engine engine(o.engine);
  Request req;
  if (!o.chat.empty()) {
    std::vector<ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", o.chat});
    req.prompt = apply_chat_template(engine.tokenizer(), messages, true);
    req.add_special_tokens = false;  // the template spells BOS itself when the model wants it
    req.parse_special = true;
  } else {
    req.prompt = o.prompt;
    req.parse_special = !o.no_parse_special;  // as the completions endpoint (and vLLM, llama.cpp) tokenize
  }
  auto& s = req.sampling;
  s.max_tokens = o.max_tokens;
  s.temperature = o.temperature;
  s.top_k = o.top_k;
  s.top_p = o.top_p;
  s.min_p = o.min_p;
  s.repetition_penalty = o.repetition_penalty;
  s.presence_penalty = o.presence_penalty;
  s.frequency_penalty = o.frequency_penalty;
  s.seed = o.seed;
  s.stop = o.stop;
  s.ignore_eos = o.ignore_eos;
  const std::vector<int32_t> prompt_ids =
      engine.tokenizer().encode(req.prompt, req.add_special_tokens, req.parse_special);
  req.prompt_ids = prompt_ids;
  req.prompt.clear();

  for (int i = 0; i < o.warmup; ++i) {  // the same prompt and a few decode steps, untimed, then out of the cache
    Request warm = req;
    warm.sampling.max_tokens = std::min(o.max_tokens, 4);
    auto warm_stream = engine.submit(std::move(warm));
    while (auto e = warm_stream->next()) {
      if (e->finish == FinishReason::kError) throw Error(ErrorKind::kInternal, "warm-up generation failed: " + e->error);
      if (e->finish != FinishReason::kNone) break;
    }
    engine.flush_prefix_cache();
  }

  const auto start = EngineClock::now();
  auto stream = engine.submit(std::move(req));
  std::vector<int32_t> output;
  std::string text;
  EngineClock::time_point first{}, last{};
  FinishReason finish = FinishReason::kNone;
  std::string error;
  int64_t cached_tokens = 0;
  while (auto e = stream->next()) {
    cached_tokens = e->usage.cached_tokens;
    output.insert(output.end(), e->token_ids.begin(), e->token_ids.end());
    text += e->text;
    if (!o.json && !e->text.empty()) {
      std::fwrite(e->text.data(), 1, e->text.size(), stdout);
      std::fflush(stdout);
    }
    if (e->first_token) first = e->time;
    if (!e->token_ids.empty()) last = e->time;
    if (e->finish != FinishReason::kNone) {
      finish = e->finish;
      error = e->error;
      break;
    }
  }
  if (finish == FinishReason::kError) throw Error(ErrorKind::kInternal, "generation failed: " + error);
  if (o.json) {
    nlohmann::json j{{"prompt_ids", prompt_ids}, {"output_ids", output}, {"text", text}, {"finish_reason", finish_reason_name(finish)}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("\n");
  const double prefill_ms = ms_between(start, first);
  const double decode_ms = ms_between(first, last);
  std::fprintf(stderr, "\nprefill: %zu tokens in %.1f ms (%.1f tok/s), %lld from the prefix cache\n", prompt_ids.size(),
               prefill_ms, prefill_ms > 0 ? 1000.0 * static_cast<double>(prompt_ids.size()) / prefill_ms : 0.0,
               static_cast<long long>(cached_tokens));
  if (output.size() > 1) {
    std::fprintf(stderr, "decode:  %zu tokens in %.1f ms (%.1f tok/s)\n", output.size() - 1, decode_ms,
                 decode_ms > 0 ? 1000.0 * static_cast<double>(output.size() - 1) / decode_ms : 0.0);
  }
  std::fprintf(stderr, "finish:  %s\n", finish_reason_name(finish));
}

void add_generate_command(CLI::App& app) {
  auto opts = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Run the built-in engine on one prompt and stream the text");
  add_engine_flags(cmd, opts->engine);
  cmd->add_option("--prompt,-p", opts->prompt,
                  "Prompt text (tokenized with BOS as the model wants; text spelling a control token, e.g. <|im_start|>, "
                  "becomes that token, as the completions endpoint does)");
  cmd->add_flag("--no-parse-special", opts->no_parse_special, "--prompt: control-token text stays text");
  cmd->add_option("--chat", opts->chat, "A user message, rendered with the model's chat template");
  cmd->add_option("--system", opts->system, "System message for --chat");
  cmd->add_option("--max-tokens,-n", opts->max_tokens, "Most tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", opts->top_k, "0 = off");
  cmd->add_option("--top-p", opts->top_p);
  cmd->add_option("--min-p", opts->min_p);
  cmd->add_option("--repetition-penalty", opts->repetition_penalty);
  cmd->add_option("--presence-penalty", opts->presence_penalty);
  cmd->add_option("--frequency-penalty", opts->frequency_penalty);
  cmd->add_option("--seed", opts->seed, "Sampling seed (same seed, same output)");
  cmd->add_option("--stop", opts->stop, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--json", opts->json, "Print {prompt_ids, output_ids, text, finish_reason} instead of streaming");
  cmd->add_option("--warmup", opts->warmup,
                  "Run the prompt this many times untimed first (up to 4 tokens each), then forget it from the prefix "
                  "cache, so the timed prefill and decode exclude one-time set-up")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([opts] { run_generate(*opts); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(10, add_generate_command);

}  // namespace servetune::cli
