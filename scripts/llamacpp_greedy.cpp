// Greedy decoding through llama.cpp's own library (llama.h), for scripts/gen_gguf_moe_goldens.py: token-id prompts in,
// llama.cpp's greedy token ids out, with each step's top-1 minus top-2 logit margin (so a test can tell a near tie).
//
// Usage: llamacpp_greedy MODEL.gguf N_NEW < prompts   (one prompt per line: space-separated token ids)
// Output: one line per prompt: "ids: a b c ... | margins: m1 m2 ..."
// Each prompt runs in a fresh context (n_ctx 256, one batch for the prompt, then one token per step) with f32 K/V
// caches and flash attention off, so llama.cpp's default f16 cache rounding does not enter the reference.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

void quiet(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf N_NEW < prompts\n", argv[0]);
    return 2;
  }
  const int n_new = std::atoi(argv[2]);
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) {
    std::fprintf(stderr, "%s: llama.cpp could not load the model\n", argv[1]);
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::vector<llama_token> tokens;
    for (llama_token t; in >> t;) tokens.push_back(t);
    if (tokens.empty()) continue;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_ubatch = 256;
    cp.n_seq_max = 1;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // as scripts/gen_model_goldens.py's llama.cpp reference
    cp.no_perf = true;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
      std::fprintf(stderr, "llama.cpp could not create a context\n");
      return 1;
    }
    llama_sampler* greedy = llama_sampler_init_greedy();
    std::vector<llama_token> out;
    std::vector<float> margins;
    llama_batch batch = llama_batch_get_one(tokens.data(), static_cast<int32_t>(tokens.size()));
    for (int step = 0; step < n_new; ++step) {
      if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "llama_decode failed\n");
        return 1;
      }
      // The token is llama.cpp's greedy sampler's; the margin comes from the same logits.
      const llama_token sampled = llama_sampler_sample(greedy, ctx, -1);
      const float* logits = llama_get_logits_ith(ctx, -1);
      int best = 0;
      for (int i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) best = i;
      }
      float second = -1e30f;
      for (int i = 0; i < n_vocab; ++i) {
        if (i != best && logits[i] > second) second = logits[i];
      }
      if (logits[sampled] != logits[best]) {
        std::fprintf(stderr, "greedy sampler chose %d, the arg max is %d\n", sampled, best);
        return 1;
      }
      out.push_back(sampled);
      margins.push_back(logits[best] - second);
      batch = llama_batch_get_one(&out.back(), 1);
    }
    std::printf("ids:");
    for (llama_token t : out) std::printf(" %d", t);
    std::printf(" | margins:");
    for (float m : margins) std::printf(" %.6g", m);
    std::printf("\n");
    std::fflush(stdout);
    llama_sampler_free(greedy);
    llama_free(ctx);
  }
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
