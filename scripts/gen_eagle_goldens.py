#!/usr/bin/env python3
"""A random-weight EAGLE(-2) draft head for stories260K and its logits as transformers' llama modules compute them.

transformers has no EAGLE forward, so the reference is transformers' own LlamaAttention, LlamaMLP, LlamaRMSNorm and
LlamaRotaryEmbedding glued the way SGLang's LlamaForCausalLMEagle glues them (EagleHead below, shared with
scripts/train_eagle_head.py):

  position i (0-based) of a sequence t_0..t_{L-1}, H_i = the target's final hidden state (after model.norm):
    x_i      = fc( concat( embed_target(t_{i+1}), H_i ) )  # embedding first; no norm on either input
    r        = x + self_attn(x)                            # no input_layernorm; HF (rotate-half) rotary at i, causal
    g_i      = r + mlp(post_attention_layernorm(r))        # the head's hidden state; no final norm
    logits_i = lm_head_target(g_i)                         # predicts t_{i+2}
  A chained step at i+1 feeds (draft token, g_i) in place of (t_{i+2}, H_{i+1}).

The target is tests/data/stories260K.gguf loaded by transformers (gguf_file=..., dequantised to f32; its config says
pad_token_id 2^32-1, which transformers 5 rejects, so it is set to None). transformers un-permutes the GGUF's q/k
rows back to the HF layout, and the head's q_proj/k_proj are in HF layout: its rotary is the rotate-half (NeoX) kind.
The load is checked against llama.cpp (tests/data/model/stories260K.greedy.json: same greedy tokens, top-5
log-probabilities within 1e-3). stories260K does NOT tie its embeddings: the head uses token_embd for the embedding
and output.weight for lm_head.

The head is seeded (SEED): Linear weights N(0, 1/fan_in), fc's embedding half x6 (stories260K's H_i has norm ~16,
its embeddings ~2.6: both inputs then weigh alike), no biases, post_attention_layernorm N(1, 0.1).

Writes tests/data/eagle/stories260K_head/ (config.json: the target's LlamaConfig with num_hidden_layers 1 and
architectures ["LlamaForCausalLMEagle"]; model.safetensors, f32: fc.weight [d, 2d],
layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.post_attention_layernorm.weight,
layers.0.mlp.{gate,up,down}_proj.weight) and tests/data/eagle/eagle_logits.json:
  {"reference", "versions", "script", "target": {"gguf", "tokens": CASES[0], "logits": [[vocab] per position]},
   "cases": [{"tokens": [...], "hidden": [[d] per position 0..L-2] (H_i), "logits": [[vocab] per position 0..L-2],
              "head_hidden": [[d] per position 0..L-2] (g_i), "argmax": [...],
              "chain": {"tokens": [d_1, d_2, d_3], "logits": [[vocab] x 3], "head_hidden": [[d] x 3]}}]}
"chain" drafts 3 chained steps after the sequence: step 1 is position L-2 (t_{L-1}, H_{L-2}) -> d_1, step 2 is
position L-1 (d_1, g_{L-2}) -> d_2, step 3 position L (d_2, g of step 2) -> d_3, each attending to the K/V of all
earlier positions. Floats are float32 values printed with 9 significant digits (parse as double, cast to float: exact).

Needs: pip install torch transformers accelerate gguf safetensors (versions recorded in the golden). Usage:
python3 scripts/gen_eagle_goldens.py   (deterministic; seconds)
"""
import importlib.metadata
import json
import os
import sys

import safetensors
import safetensors.torch
import torch
import transformers
from transformers.models.llama import modeling_llama as ll

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_moe_goldens import rows  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF = "stories260K.gguf"
OUT = os.path.join(ROOT, "tests/data/eagle/stories260K_head")
GOLDEN = os.path.join(ROOT, "tests/data/eagle/eagle_logits.json")
SEED = 6  # of a few tried, one whose drafts vary along the sequences
CASES = [[1, 17, 200, 45, 3, 99, 250, 7, 7, 7, 301, 12], [1, 5, 6, 7, 8]]
CHAIN = 3


class EagleLayer(torch.nn.Module):
    """A llama decoder layer without input_layernorm (EAGLE's first layer)."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = ll.LlamaAttention(cfg, layer_idx=0)
        self.post_attention_layernorm = ll.LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = ll.LlamaMLP(cfg)


class EagleHead(torch.nn.Module):
    """SGLang's LlamaForCausalLMEagle without its embedding and lm_head (the target's are passed in)."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg.hidden_size
        self.fc = torch.nn.Linear(2 * d, d, bias=False)
        self.layers = torch.nn.ModuleList([EagleLayer(cfg)])
        self.rotary = ll.LlamaRotaryEmbedding(cfg)

    def forward(self, emb, hidden, lm_head_weight, pos=None, mask=None):
        """emb [B, T, d] (embed(t_{i+1})), hidden [B, T, d] (H_i) at positions 0..T-1 (or pos [B, T], with an additive
        mask [1, 1, T, T]; default causal) -> (logits, g)."""
        b, t, _ = emb.shape
        x = self.fc(torch.cat([emb, hidden], dim=-1))
        pos = torch.arange(t).unsqueeze(0).expand(b, t) if pos is None else pos
        mask = torch.full((t, t), float("-inf")).triu(1).view(1, 1, t, t) if mask is None else mask
        layer = self.layers[0]
        a = layer.self_attn(x, position_embeddings=self.rotary(x, pos), attention_mask=mask)[0]
        r = x + a
        g = r + layer.mlp(layer.post_attention_layernorm(r))
        return g @ lm_head_weight.T, g


def head_config(target_cfg):
    """The head's config.json: the target's LlamaConfig, one layer, EAGLE's architecture name."""
    conf = target_cfg.to_dict()
    for k in ("quantization_config", "_name_or_path", "_model_name_or_path", "_attn_implementation", "dtype",
              "transformers_version", "use_cache", "id2label", "label2id", "chunk_size_feed_forward", "problem_type",
              "is_encoder_decoder", "output_attentions", "output_hidden_states", "return_dict"):
        conf.pop(k, None)
    conf.update(num_hidden_layers=1, architectures=["LlamaForCausalLMEagle"], torch_dtype="float32",
                rope_theta=conf["rope_parameters"]["rope_theta"])  # also top-level, for pre-v5 readers
    return conf


def save_head(head, cfg, out, dtype):
    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().to(dtype).contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    safetensors.torch.save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    conf = head_config(cfg)
    conf["torch_dtype"] = str(dtype).replace("torch.", "")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def load_target(directory, filename, attn="eager"):
    """transformers' GGUF loader, dequantised to f32. pad_token_id (2^32-1 in some GGUFs) dropped."""
    cfg = transformers.AutoConfig.from_pretrained(directory, gguf_file=filename)
    if cfg.pad_token_id is not None and not 0 <= cfg.pad_token_id < cfg.vocab_size:
        cfg.pad_token_id = None
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, config=cfg,
                                                              dtype=torch.float32, attn_implementation=attn)
    model.config._attn_implementation = attn
    return model.eval()


def check_against_llamacpp(model):
    """Greedy tokens and top-5 log-probs of llama.cpp (tests/data/model/stories260K.greedy.json), plain prompts."""
    with open(os.path.join(ROOT, "tests/data/model/stories260K.greedy.json")) as f:
        ref = json.load(f)
    worst = 0.0
    for case in ref["cases"]:
        if case.get("kind") != "plain":
            continue
        seq = case["prompt_ids"] + case["output_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([seq])).logits[0].double(), -1)
        n = len(case["prompt_ids"])
        for j, top in enumerate(case["top5"]):
            row = lp[n - 1 + j]
            assert row.argmax().item() == top[0][0] == seq[n + j], (case["prompt"], j)
            worst = max(worst, max(abs(row[tok].item() - v) for tok, v in top))
    assert worst < 1e-3, worst
    print(f"transformers' GGUF load matches llama.cpp: same greedy tokens, top-5 log-probs within {worst:.2e}")


def random_head(cfg, seed):
    torch.manual_seed(seed)
    head = EagleHead(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        head.fc.weight[:, :cfg.hidden_size] *= 6.0
    return head.eval()


def run_case(model, head, tokens):
    embed, lm_head = model.model.embed_tokens.weight, model.lm_head.weight
    with torch.no_grad():
        hid = model.model(torch.tensor([tokens])).last_hidden_state
        t = torch.tensor([tokens])
        logits, g = head(embed[t[:, 1:]], hid[:, :-1], lm_head)
        case = {"tokens": tokens, "hidden": rows(hid[0, :-1]), "logits": rows(logits[0]), "head_hidden": rows(g[0]),
                "argmax": logits[0].argmax(-1).tolist()}
        # Chained drafts: the whole extended input in one causal pass equals step-by-step decoding with a K/V cache.
        toks, hs = t[0, 1:].tolist(), hid[0, :-1]
        drafts = []
        for _ in range(CHAIN):
            logits, g = head(embed[torch.tensor([toks])], hs.unsqueeze(0), lm_head)
            d = logits[0, -1].argmax().item()
            drafts.append(d)
            toks, hs = toks + [d], torch.cat([hs, g[0, -1:]])
        n = len(tokens) - 2
        case["chain"] = {"tokens": drafts, "logits": rows(logits[0, n:n + CHAIN]),
                         "head_hidden": rows(g[0, n:n + CHAIN])}
        assert logits[0, n].argmax().item() == case["argmax"][-1]
    return case


def main():
    model = load_target(os.path.join(ROOT, "tests/data"), GGUF)
    check_against_llamacpp(model)
    cfg = model.config
    head = random_head(cfg, SEED)
    save_head(head, cfg, OUT, torch.float32)
    reloaded = safetensors.torch.load_file(os.path.join(OUT, "model.safetensors"))
    assert all(torch.equal(reloaded[k], v) for k, v in head.state_dict().items() if k in reloaded)
    assert sorted(reloaded) == sorted(k for k in head.state_dict() if not k.startswith("rotary.")), sorted(reloaded)

    cases = [run_case(model, head, s) for s in CASES]
    for c in cases:
        print(f"  case {c['tokens']}: argmax {c['argmax']}, chain {c['chain']['tokens']}")
    with torch.no_grad():
        target_logits = model(torch.tensor([CASES[0]])).logits[0]
    golden = {
        "reference": "transformers LlamaAttention / LlamaMLP / LlamaRMSNorm / LlamaRotaryEmbedding + SGLang's "
                     "LlamaForCausalLMEagle glue (see scripts/gen_eagle_goldens.py)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "safetensors": safetensors.__version__, "accelerate": importlib.metadata.version("accelerate"),
                     "gguf": importlib.metadata.version("gguf")},
        "script": "scripts/gen_eagle_goldens.py",
        "seed": SEED,
        "target": {"gguf": "tests/data/" + GGUF, "tokens": CASES[0], "logits": rows(target_logits)},
        "cases": cases,
    }
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, "and", GOLDEN)


if __name__ == "__main__":
    main()
