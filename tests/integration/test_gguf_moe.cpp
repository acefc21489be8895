// The mixture-of-experts and latent-attention families from GGUF as llama.cpp's own converter writes them: greedy ids
// of the tiny Qwen3-MoE, Mixtral, DeepSeek-V3, DeepSeek-V2 and Qwen2-MoE models (tests/data/gguf_moe, made by
// scripts/gen_gguf_moe_goldens.py with the llama.cpp of the llama-cpp-python 0.3.36 sdist) equal llama.cpp's for
// 8 prompts x 64 new tokens, run on the model directly and through the Engine; the converted weights give transformers' logits; the configs read from GGUF metadata
// agree with the HF config.json ones; and a file missing one stacked expert tensor or a needed key is refused naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "gguf_builder.h"
#include "model/checkpoint.h"
#include "model/kv_storage.h"
#include "model_batches.h"
#include "servetune/engine.h"
#include "test_paths.h"

namespace servetune {
namespace {

using testing::one_sequence;

const nlohmann::json& goldens() {
  static const nlohmann::json doc = [] {
    std::ifstream in(testing::data_path("gguf_moe/greedy.json"));
    return nlohmann::json::parse(in);
  }();
  return doc;
}

std::string gguf_path(const std::string& model) { return testing::data_path("gguf_moe/" + model + ".gguf"); }

int32_t argmax(const std::vector<float>& logits, size_t row, size_t vocab) {
  const auto first = logits.begin() + static_cast<std::ptrdiff_t>(row * vocab);
  return static_cast<int32_t>(std::max_element(first, first + static_cast<std::ptrdiff_t>(vocab)) - first);
}

class GgufMoe : public ::testing::TestWithParam<std::string> {};

// Prompt in one pass, then one token per step through the paged cache, always the arg max.
TEST_P(GgufMoe, GreedyIdsMatchLlamaCpp) {
  const std::string& name = GetParam();
  Checkpoint ck(gguf_path(name), LoadFormat::kGguf);
  auto backend = make_backend("cpu", 2);
  auto model = ck.load(*backend, ParallelContext{});
  const auto vocab = static_cast<size_t>(model->config().vocab);
  const int n_new = goldens().at("n_new").get<int>();
  const int64_t page = 16, blocks = 8;  // 128 positions: the longest prompt (57) + 64
  for (const auto& c : goldens().at("models").at(name)) {
    auto tokens = c.at("prompt").get<std::vector<int32_t>>();
    const auto expected = c.at("ids").get<std::vector<int32_t>>();
    KvStorage kv(*backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
    std::vector<float> logits;
    std::vector<int32_t> ours;
    Batch prefill = one_sequence(tokens, 0, static_cast<int>(tokens.size()), page, blocks);
    prefill.logits_indices = {static_cast<int32_t>(tokens.size()) - 1};
    model->forward(prefill, kv, logits);
    for (int step = 0; step < n_new; ++step) {
      ours.push_back(argmax(logits, 0, vocab));
      tokens.push_back(ours.back());
      if (step + 1 < n_new) {
        const int t = static_cast<int>(tokens.size()) - 1;
        model->forward(one_sequence(tokens, t, t + 1, page, blocks), kv, logits);
      }
    }
    EXPECT_EQ(ours, expected) << name << " prompt of " << c.at("prompt").size() << " tokens";
  }
}

// The same through the Engine's public API: all 8 prompts at once (continuous batching, chunked prefill, prefix
// cache, paged f32 cache), greedy, EOS ignored as llama.cpp's reference run does.
TEST_P(GgufMoe, EngineGreedyIdsMatchLlamaCpp) {
  const std::string& name = GetParam();
  EngineConfig config;
  config.model = gguf_path(name);
  config.kv_cache_dtype = KvCacheDtype::kF32;
  config.threads = 2;
  config.chunked_prefill_size = 16;
  config.page_size = 8;
  Engine engine(config);
  const int n_new = goldens().at("n_new").get<int>();
  const auto& cases = goldens().at("models").at(name);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& c : cases) {
    Request r;
    r.prompt_ids = c.at("prompt").get<std::vector<int32_t>>();
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = n_new;
    r.sampling.ignore_eos = true;
    r.detokenize = false;
    streams.push_back(engine.submit(r));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    std::vector<int32_t> out;
    while (auto e = streams[i]->next()) {
      out.insert(out.end(), e->token_ids.begin(), e->token_ids.end());
      if (e->finish != FinishReason::kNone) {
        EXPECT_EQ(e->finish, FinishReason::kLength) << e->error;
        break;
      }
    }
    EXPECT_EQ(out, cases[i].at("ids").get<std::vector<int32_t>>()) << name << " prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GgufMoe,
                         ::testing::Values("qwen3_moe_tiny", "mixtral_tiny", "deepseek_v3_tiny", "deepseek_v2_lite_tiny",
                                           "deepseek_v2_group_tiny", "qwen2_moe_tiny"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// The converted weights are the HF ones in llama.cpp's layout (stacked experts, q/k permuted for llama's interleaved
// rotary, kv_b split into attn_k_b / attn_v_b): one pass over the transformers golden sequences gives transformers'
// logits (scripts/gen_moe_goldens.py), for every model whose routing GGUF can express as HF does.
TEST(GgufMoeWeights, LogitsMatchTransformers) {
  std::ifstream in(testing::data_path("hf_models/moe_logits.json"));
  const auto hf = nlohmann::json::parse(in);
  auto backend = make_backend("cpu", 2);
  for (const std::string name : {"qwen3_moe_tiny", "mixtral_tiny", "deepseek_v3_tiny", "deepseek_v2_lite_tiny"}) {
    Checkpoint ck(gguf_path(name), LoadFormat::kGguf);
    auto model = ck.load(*backend, ParallelContext{});
    for (const auto& c : hf.at("models").at(name)) {
      const auto tokens = c.at("tokens").get<std::vector<int32_t>>();
      const auto expected = c.at("logits").get<std::vector<std::vector<float>>>();
      const int64_t page = 16, blocks = 8;
      KvStorage kv(*backend, model->config(), model->local_kv_heads(), blocks, page, DType::kF32);
      std::vector<float> logits;
      model->forward(one_sequence(tokens, 0, static_cast<int>(tokens.size()), page, blocks), kv, logits);
      const size_t vocab = expected[0].size();
      ASSERT_EQ(logits.size(), expected.size() * vocab) << name;
      for (size_t r = 0; r < expected.size(); ++r) {
        float scale = 0.0f;
        for (float v : expected[r]) scale = std::max(scale, std::fabs(v));
        for (size_t i = 0; i < vocab; ++i) {
          ASSERT_NEAR(logits[r * vocab + i], expected[r][i], 1e-4f * scale) << name << " position " << r << " token " << i;
        }
      }
    }
  }
}

// What the GGUF metadata says equals what config.json says, field by field, except DeepSeek-V2's group ranking:
// llama.cpp ranks groups by their two best scores in every family (GGUF has no topk_method), transformers' V2 by
// the best one.
TEST(GgufMoeConfig, MatchesHfConfig) {
  for (const std::string name : {"qwen3_moe_tiny", "mixtral_tiny", "deepseek_v3_tiny", "deepseek_v2_lite_tiny", "deepseek_v2_group_tiny"}) {
    SCOPED_TRACE(name);
    const ModelConfig g = Checkpoint(gguf_path(name), LoadFormat::kGguf).config();
    const ModelConfig h = Checkpoint(testing::data_path("hf_models/" + name), LoadFormat::kSafetensors).config();
    EXPECT_EQ(g.n_layers, h.n_layers);
    EXPECT_EQ(g.hidden, h.hidden);
    EXPECT_EQ(g.n_heads, h.n_heads);
    EXPECT_EQ(g.n_kv_heads, h.n_kv_heads);
    EXPECT_EQ(g.head_dim, h.head_dim);
    EXPECT_EQ(g.vocab, h.vocab);
    EXPECT_EQ(g.context_length, h.context_length);
    EXPECT_EQ(g.rope_dim, h.rope_dim);
    EXPECT_FLOAT_EQ(g.rope_theta, h.rope_theta);
    EXPECT_FLOAT_EQ(g.rms_eps, h.rms_eps);
    EXPECT_EQ(g.rope_scaling, h.rope_scaling);
    EXPECT_FLOAT_EQ(g.rope_factor, h.rope_factor);
    EXPECT_EQ(g.rope_original_context, h.rope_original_context);
    EXPECT_FLOAT_EQ(g.attention_scale_factor, h.attention_scale_factor);
    EXPECT_EQ(g.qk_norm, h.qk_norm);
    EXPECT_EQ(g.tied_embeddings, h.tied_embeddings);
    EXPECT_EQ(g.mla.q_lora_rank, h.mla.q_lora_rank);
    EXPECT_EQ(g.mla.kv_lora_rank, h.mla.kv_lora_rank);
    EXPECT_EQ(g.mla.qk_nope_dim, h.mla.qk_nope_dim);
    EXPECT_EQ(g.mla.v_head_dim, h.mla.v_head_dim);
    const MoeRouting &gr = g.moe.routing, &hr = h.moe.routing;
    EXPECT_EQ(gr.n_experts, hr.n_experts);
    EXPECT_EQ(gr.top_k, hr.top_k);
    EXPECT_EQ(gr.scoring, hr.scoring);
    EXPECT_EQ(gr.n_group, hr.n_group);
    EXPECT_EQ(gr.topk_group, hr.topk_group);
    if (name != "deepseek_v2_group_tiny") {
      EXPECT_EQ(gr.group_score, hr.group_score);
    }
    EXPECT_EQ(gr.renormalize, hr.renormalize);
    EXPECT_FLOAT_EQ(gr.scaling, hr.scaling);
    EXPECT_EQ(g.moe.expert_ffn, h.moe.expert_ffn);
    EXPECT_EQ(g.moe.shared_ffn, h.moe.shared_ffn);
    EXPECT_EQ(g.moe.shared_gate, h.moe.shared_gate);
    EXPECT_EQ(g.moe.selection_bias, h.moe.selection_bias);
    EXPECT_EQ(g.moe.moe_layer, h.moe.moe_layer);
  }
}

// A copy of `f` without tensor `dropped` and metadata key `dropped_key`, with `u32_key` set to `u32_value` (metadata
// scalars and string arrays kept; numeric arrays, the token types, are not needed to load a model).
std::vector<uint8_t> rewritten(const GgufFile& f, const std::string& dropped, const std::string& dropped_key = "",
                               const std::string& u32_key = "", uint32_t u32_value = 0) {
  testing::GgufBuilder b;
  for (const auto& [key, v] : f.metadata()) {
    if (key == dropped_key || key == u32_key) continue;
    switch (v.type()) {
      case GgufType::kString: b.kv_str(key, std::string(*v.as_string())); break;
      case GgufType::kFloat32: b.kv_f32(key, static_cast<float>(*v.as_float())); break;
      case GgufType::kFloat64: b.kv_f64(key, *v.as_float()); break;
      case GgufType::kBool: b.kv_bool(key, *v.as_bool()); break;
      case GgufType::kArray:
        if (v.elem_type() == GgufType::kString) b.kv_str_array(key, {v.strings().begin(), v.strings().end()});
        break;
      default: b.kv_u64(key, static_cast<uint64_t>(*v.as_int())); break;
    }
  }
  if (!u32_key.empty()) b.kv_u32(u32_key, u32_value);
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name == dropped) continue;
    b.tensor(t.name, {t.dims.begin(), t.dims.end()}, t.ggml_type, {t.data, t.data + t.n_bytes});
  }
  return b.build();
}

std::string write_temp(const std::string& name, const std::vector<uint8_t>& bytes) {
  return testing::temp_file(name, std::string(bytes.begin(), bytes.end()));
}

// Reading the config of `path` throws Error(kind) whose message names `what` and the file.
void expect_config_error(const std::string& path, ErrorKind kind, const std::string& what) {
  try {
    Checkpoint ck(path, LoadFormat::kGguf);
    ADD_FAILURE() << path << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(GgufMoeBadInput, MetadataErrorsAreNamed) {
  const GgufFile v3(gguf_path("deepseek_v3_tiny"));
  expect_config_error(write_temp("gguf_moe_no_used.gguf", rewritten(v3, "", "deepseek2.expert_used_count")),
                      ErrorKind::kFormat, "deepseek2.expert_used_count");
  expect_config_error(write_temp("gguf_moe_no_kv_lora.gguf", rewritten(v3, "", "deepseek2.attention.kv_lora_rank")),
                      ErrorKind::kFormat, "deepseek2.attention.kv_lora_rank");
  expect_config_error(write_temp("gguf_moe_gating.gguf", rewritten(v3, "", "", "deepseek2.expert_gating_func", 4)),
                      ErrorKind::kUnsupported, "deepseek2.expert_gating_func 4");
  // Without the log multiplier llama.cpp's yarn scales the rotary part's magnitude, which the engine does not.
  expect_config_error(write_temp("gguf_moe_yarn.gguf", rewritten(v3, "", "deepseek2.rope.scaling.yarn_log_multiplier")),
                      ErrorKind::kUnsupported, "yarn_log_multiplier");
  const GgufFile qwen(gguf_path("qwen3_moe_tiny"));
  expect_config_error(write_temp("gguf_moe_no_experts.gguf", rewritten(qwen, "", "qwen3moe.expert_count")),
                      ErrorKind::kFormat, "qwen3moe.expert_count");
}

TEST(GgufMoeBadInput, MissingExpertTensorIsNamed) {
  const GgufFile source(gguf_path("qwen3_moe_tiny"));
  const std::string dropped = "blk.1.ffn_down_exps.weight";
  ASSERT_NE(source.tensor(dropped), nullptr);
  const std::string path = write_temp("gguf_moe_missing_expert.gguf", rewritten(source, dropped));
  Checkpoint ck(path, LoadFormat::kGguf);  // the metadata alone is fine
  auto backend = make_backend("cpu", 1);
  try {
    ck.load(*backend, ParallelContext{});
    FAIL() << "a GGUF without " << dropped << " loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
    EXPECT_NE(std::string(e.what()).find(dropped), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune
