#!/usr/bin/env python3
"""A tiny DeepSeek-V3 with a TRAINED multi-token-prediction (MTP, "next-n") layer, and the MTP layer's logits as
SGLang and vLLM run it (issue #39).

transformers has no MTP forward (DeepseekV3ForCausalLM ignores model.layers.{num_hidden_layers}), so the reference is
transformers' own DeepseekV3DecoderLayer, RMSNorm and rotary embedding glued the way SGLang's DeepseekModelNextN and
vLLM's DeepSeekMultiTokenPredictorLayer glue them:

  position i (0-based) of a sequence t_0..t_{L-1}, H_i = the target's final hidden state (after model.norm):
    x_i    = eh_proj( concat( enorm(embed_mtp(t_{i+1})), hnorm(H_i) ) )      # embedding first, as both engines do
    y      = DeepseekV3DecoderLayer(layer_idx = num_hidden_layers)(x, rotary positions i, causal)
    g_i    = shared_head.norm(y_i)                                           # also the next chained step's hidden
    logits = shared_head.head(g_i)                                           # predicts t_{i+2}

The target is gen_moe_goldens.py's deepseek_v3_tiny shape (seed 107). Its MTP layer is trained (Adam, a fixed number
of steps, seeded) to predict t_{i+2} on the target's own greedy continuations of random prompts, so that speculative
decoding with it accepts tokens: a random MTP layer would accept ~1/320 of its drafts and leave the acceptance path
untested. The held-out acceptance (MTP argmax == target's next greedy token) is printed and recorded.

Writes tests/data/hf_models/deepseek_v3_mtp_tiny/ (f32 safetensors in DeepSeek-V3's published layout, MTP layer as
model.layers.3.*; config.json with num_nextn_predict_layers 1; the byte-level tokenizer.json) and
tests/data/hf_models/mtp_logits.json:
  {"reference", "versions", "script", "train": {...}, "cases": [{"tokens": [...], "hidden": [[hidden] per position
   0..L-2], "logits": [[vocab] per position 0..L-2], "mtp_hidden": [[hidden] per position], "argmax": [...]}]}
"hidden" is H_0..H_{L-2} (the MTP layer's second input), so the C++ test can check the MTP layer alone.

Needs: pip install torch transformers tokenizers safetensors (versions recorded in the golden). Usage:
python3 scripts/gen_mtp_goldens.py   (deterministic; about a minute on two cores)
"""
import json
import os
import sys

import safetensors.torch
import tokenizers
import torch
import transformers
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_goldens import byte_level_tokenizer  # noqa: E402
from gen_moe_goldens import deepseek_v3_config, randomise, f32, rows  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests/data/hf_models/deepseek_v3_mtp_tiny")
GOLDEN = os.path.join(ROOT, "tests/data/hf_models/mtp_logits.json")
SEED = 107
CASES = [[1, 17, 200, 45, 3, 99, 250, 7, 7, 7, 301, 12], [1, 5, 6, 7, 8]]
TRAIN = dict(prompts=96, prompt_len=6, new_tokens=40, steps=400, lr=3e-3, held_out=16)


class MtpLayer(torch.nn.Module):
    """DeepSeek's next-n module: the tensors under model.layers.{N}. in the published checkpoint."""

    def __init__(self, cfg, index):
        super().__init__()
        d = cfg.hidden_size
        self.embed_tokens = torch.nn.Embedding(cfg.vocab_size, d)
        self.enorm = ds.DeepseekV3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.hnorm = ds.DeepseekV3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * d, d, bias=False)
        self.block = ds.DeepseekV3DecoderLayer(cfg, layer_idx=index)
        self.shared_head = torch.nn.Module()
        self.shared_head.norm = ds.DeepseekV3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.shared_head.head = torch.nn.Linear(d, cfg.vocab_size, bias=False)

    def forward(self, next_tokens, hidden, rotary):
        """next_tokens [B, T] (t_{i+1}), hidden [B, T, d] (H_i) at positions 0..T-1 -> (logits, normed hidden)."""
        x = self.eh_proj(torch.cat([self.enorm(self.embed_tokens(next_tokens)), self.hnorm(hidden)], dim=-1))
        b, t = next_tokens.shape
        pos = torch.arange(t).unsqueeze(0).expand(b, t)
        mask = torch.full((t, t), float("-inf")).triu(1).view(1, 1, t, t)
        y = self.block(x, attention_mask=mask, position_ids=pos, position_embeddings=rotary(x, pos))
        y = y[0] if isinstance(y, tuple) else y
        g = self.shared_head.norm(y)
        return self.shared_head.head(g), g


def published_layout(sd):
    """transformers 5 keeps experts fused in memory (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]); the
    published checkpoints (and save_pretrained) hold one gate/up/down matrix per expert."""
    out = {}
    for k, v in sd.items():
        v = v.detach().contiguous()
        if k.endswith("mlp.experts.gate_up_proj"):
            base, half = k[:-len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :half].clone()
                out[f"{base}{e}.up_proj.weight"] = v[e, half:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            base = k[:-len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].clone()
        else:
            out[k] = v.clone()
    return out


def state_dict_of(mtp, index):
    p = f"model.layers.{index}."
    return published_layout({p + k.replace("block.", ""): v for k, v in mtp.state_dict().items()})


def target_hidden(model, seqs):
    with torch.no_grad():
        return model.model(torch.tensor(seqs)).last_hidden_state


def greedy(model, prompts, new_tokens):
    seqs = torch.tensor(prompts)
    with torch.no_grad():
        for _ in range(new_tokens):
            nxt = model(seqs).logits[:, -1].argmax(-1, keepdim=True)
            seqs = torch.cat([seqs, nxt], dim=1)
    return seqs.tolist()


def acceptance(model, mtp, seqs, start):
    """Fraction of positions i >= start - 1 whose MTP argmax (from H_i, t_{i+1}) equals t_{i+2}."""
    h = target_hidden(model, seqs)
    t = torch.tensor(seqs)
    with torch.no_grad():
        logits, _ = mtp(t[:, 1:-1], h[:, :-2], model.model.rotary_emb)
    hit = (logits.argmax(-1) == t[:, 2:])[:, start - 1:]
    return hit.float().mean().item()


def main():
    torch.manual_seed(SEED)
    cfg = deepseek_v3_config(num_mtp_layers=1)
    cfg._attn_implementation = "eager"
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    randomise(model, SEED)
    index = cfg.num_hidden_layers
    mtp = MtpLayer(cfg, index)
    g = torch.Generator().manual_seed(SEED + 7)
    with torch.no_grad():  # the layer starts as the published one would before training: norms N(1, 0.1)
        for name, p in mtp.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        mtp.embed_tokens.weight.copy_(model.model.embed_tokens.weight)  # DeepSeek ships copies of the target's
        mtp.shared_head.head.weight.copy_(model.lm_head.weight)
        for name, b in mtp.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=g))

    # Training data: the target's greedy continuations of random prompts (bos first).
    n = TRAIN["prompts"] + TRAIN["held_out"]
    prompts = [[1] + torch.randint(3, cfg.vocab_size, (TRAIN["prompt_len"] - 1,), generator=g).tolist() for _ in range(n)]
    seqs = greedy(model, prompts, TRAIN["new_tokens"])
    train, held = seqs[:TRAIN["prompts"]], seqs[TRAIN["prompts"]:]
    before = acceptance(model, mtp, held, TRAIN["prompt_len"])
    h = target_hidden(model, train)
    t = torch.tensor(train)
    params = [p for name, p in mtp.named_parameters() if not name.startswith(("embed_tokens", "shared_head.head"))]
    opt = torch.optim.Adam(params, lr=TRAIN["lr"])
    mtp.train()
    for step in range(TRAIN["steps"]):
        logits, _ = mtp(t[:, 1:-1], h[:, :-2], model.model.rotary_emb)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), t[:, 2:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == TRAIN["steps"] - 1:
            print(f"  step {step}: loss {loss.item():.4f}")
    mtp.eval()
    after = acceptance(model, mtp, held, TRAIN["prompt_len"])
    print(f"held-out MTP acceptance (argmax == target's greedy t+2): {before:.3f} untrained -> {after:.3f} trained")

    os.makedirs(OUT, exist_ok=True)
    sd = published_layout(model.state_dict())
    sd.update(state_dict_of(mtp, index))
    safetensors.torch.save_file(sd, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    conf = cfg.to_dict()
    conf["num_nextn_predict_layers"] = 1
    conf.pop("num_mtp_layers", None)
    conf.pop("_attn_implementation", None)
    conf["architectures"] = ["DeepseekV3ForCausalLM"]
    conf["scoring_func"] = "sigmoid"  # gen_gguf_moe_goldens.py: transformers 5 leaves it out, DeepSeek ships it
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    byte_level_tokenizer(os.path.join(OUT, "tokenizer.json"))

    # The saved target reloads with transformers to the same logits (only the MTP keys unexpected).
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        OUT, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    assert all(k.startswith(f"model.layers.{index}.") for k in info["unexpected_keys"]), info["unexpected_keys"]
    with torch.no_grad():
        for s in CASES:
            assert torch.equal(loaded(torch.tensor([s])).logits, model(torch.tensor([s])).logits)

    cases = []
    for s in CASES:
        hid = target_hidden(model, [s])
        tt = torch.tensor([s])
        with torch.no_grad():
            logits, gnorm = mtp(tt[:, 1:], hid[:, :-1], model.model.rotary_emb)
        cases.append({"tokens": s, "hidden": rows(hid[0, :-1]), "logits": rows(logits[0]), "mtp_hidden": rows(gnorm[0]),
                      "argmax": logits[0].argmax(-1).tolist()})
    golden = {
        "reference": "transformers DeepseekV3DecoderLayer / RMSNorm / rotary + SGLang's and vLLM's next-n glue "
                     "(see scripts/gen_mtp_goldens.py)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__},
        "script": "scripts/gen_mtp_goldens.py",
        "train": dict(TRAIN, seed=SEED, acceptance_untrained=round(before, 4), acceptance_trained=round(after, 4)),
        "cases": cases,
    }
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, "and", GOLDEN)


if __name__ == "__main__":
    main()
