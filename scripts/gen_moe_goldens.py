#!/usr/bin/env python3
"""Logits and routing goldens from HF transformers (CPU torch) for tiny random-weight MoE / MLA models (issue #37).

Builds, seeded, with transformers itself and saves under tests/data/hf_models/<name>/ (f32 safetensors in the layout
the published checkpoints use, config.json as transformers writes it, the byte-level tokenizer.json of
gen_hf_goldens.py):

  qwen3_moe_tiny          Qwen3MoeForCausalLM: softmax top-2 of 8, norm_topk_prob, q/k norms
  mixtral_tiny            MixtralForCausalLM: softmax top-2 of 8 (always renormalised), `block_sparse_moe.experts.N.w1/w2/w3`
  deepseek_v3_tiny        DeepseekV3ForCausalLM: MLA with q_lora, yarn, sigmoid routing with e_score_correction_bias
                          (random, so "bias for selection only" is exercised), group-limited top-4 of 16, 1 shared expert
  deepseek_v2_lite_tiny   DeepseekV2ForCausalLM: MLA without q_lora (V2-Lite), softmax greedy top-6 of 16, 2 shared experts
  deepseek_v2_group_tiny  as deepseek_v2_lite_tiny with topk_method group_limited_greedy (n_group 4, topk_group 2)
  deepseek_v3_tiny_fp8    deepseek_v3_tiny's weights, decoder Linear weights (all but mlp.gate) stored as DeepSeek ships
                          them: float8_e4m3fn `weight` + f32 `weight_scale_inv` per 128x128 block (one block per matrix)
  deepseek_v3_small_fp8   a wider DeepSeek-V3 (hidden 320, ...) whose matrices span several and partial 128x128 blocks

Every RMSNorm weight is drawn as N(1, 0.1) (transformers initialises them to ones, which would hide a loader that drops
one). For the fp8 models the logits are those of the DEQUANTISED weights (fp8 * scale_inv, in f32) run by transformers.

Golden file tests/data/hf_models/moe_logits.json:
  {"reference": "...", "versions": {...}, "script": ..., "float_format": ...,
   "models":  {name: [{"tokens": [...], "logits": [[vocab floats] per position], "argmax": [id per position]}, ...]},
   "routing": {name: {"layer": i, "tokens": SEQUENCES[0], "gate_input": [[hidden] per token],
                      "router_logits": [[n_experts] per token], "expert_ids": [[k] per token],
                      "expert_weights": [[k] per token]}}}
"models" has the same layout as logits.json of gen_hf_goldens.py. Floats are float32 values printed with 9 significant
digits (parse as double, cast to float: exact). "routing" is what the router module (`mlp.gate`, `block_sparse_moe.gate`)
of the first MoE layer returns for the first sequence: its input (post_attention_layernorm output), its logits
(pre-softmax / pre-sigmoid, no bias) and the selected experts with their final weights (after renormalisation and
routed_scaling_factor, as multiplied into the expert outputs); per token sorted by descending weight.

Needs: pip install torch transformers tokenizers safetensors  (versions are recorded in the golden).
Usage: python3 scripts/gen_moe_goldens.py
"""
import json
import math
import os
import shutil
import sys
import tempfile

import safetensors
import safetensors.torch
import tokenizers
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_goldens import SEQUENCES, byte_level_tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests/data/hf_models")
GOLDEN = os.path.join(OUT, "moe_logits.json")

FP8_MAX = 448.0  # largest finite float8_e4m3fn
BLOCK = 128
FP8_QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [BLOCK, BLOCK]}

# Yarn as DeepSeek-V3 ships it (factor 40, mscale = mscale_all_dim = 1), on a context small enough to matter.
YARN_V3 = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
           "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
# DeepSeek-V2-Lite ships mscale = mscale_all_dim = 0.707: the softmax-scale factor then differs from V3's.
YARN_V2 = dict(YARN_V3, mscale=0.707, mscale_all_dim=0.707)

COMMON = dict(vocab_size=320, hidden_size=64, max_position_embeddings=256, initializer_range=0.1,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def deepseek_v3_config(**kw):
    args = dict(COMMON, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, first_k_dense_replace=1,
                num_attention_heads=4, num_key_value_heads=4, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
                topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=32,
                kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rms_norm_eps=1e-6,
                rope_parameters=dict(YARN_V3), num_mtp_layers=0)  # no MTP weights: config says num_nextn_predict_layers 0
    args.update(kw)
    return transformers.DeepseekV3Config(**args)


def deepseek_v2_config(**kw):
    args = dict(COMMON, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, first_k_dense_replace=1,
                num_attention_heads=4, num_key_value_heads=4, n_routed_experts=16, num_experts_per_tok=6,
                n_shared_experts=2, routed_scaling_factor=1.0, norm_topk_prob=False, topk_method="greedy",
                q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                rms_norm_eps=1e-6, rope_parameters=dict(YARN_V2))
    args.update(kw)
    return transformers.DeepseekV2Config(**args)


# name -> (class, config builder, seed, fp8 source): fp8 source None = plain f32 model; "self" = quantise this model;
# a name = quantise that (already built) model's weights.
SPECS = {
    "qwen3_moe_tiny": ("Qwen3MoeForCausalLM", lambda: transformers.Qwen3MoeConfig(
        **COMMON, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, sliding_window=None, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), 101, None),
    "mixtral_tiny": ("MixtralForCausalLM", lambda: transformers.MixtralConfig(
        **COMMON, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=None, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), 102, None),
    "deepseek_v3_tiny": ("DeepseekV3ForCausalLM", deepseek_v3_config, 103, None),
    "deepseek_v2_lite_tiny": ("DeepseekV2ForCausalLM", deepseek_v2_config, 104, None),
    "deepseek_v2_group_tiny": ("DeepseekV2ForCausalLM", lambda: deepseek_v2_config(
        topk_method="group_limited_greedy", n_group=4, topk_group=2), 105, None),
    "deepseek_v3_tiny_fp8": ("DeepseekV3ForCausalLM", deepseek_v3_config, None, "deepseek_v3_tiny"),
    # 8 heads: q_b 192->192 rows, kv_a 320->168, kv_b 160->256, o 128->320, experts 320<->160, dense 320<->256:
    # every matrix has >1 block and most have a partial one.
    "deepseek_v3_small_fp8": ("DeepseekV3ForCausalLM", lambda: deepseek_v3_config(
        hidden_size=320, intermediate_size=256, moe_intermediate_size=160, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=8, num_key_value_heads=8, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, q_lora_rank=192, kv_lora_rank=160), 106, "self"),
}


def f32(v):
    return float(f"{float(v):.9g}")


def rows(t):
    return [[f32(v) for v in row] for row in t.tolist()]


def randomise(model, seed):
    """Weights transformers leaves constant get random values: RMSNorm weights N(1, 0.1), DeepSeek-V3's
    e_score_correction_bias N(0, 0.5). Token embeddings N(0, 1): with initializer_range 0.1 they would be small next to
    the first attention output (an average over earlier tokens), and every token would pick the same experts.
    Router weights must already be random."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=g))
    for name, p in model.named_parameters():
        if name.endswith(".gate.weight"):
            assert p.abs().min() > 0 and p.std() > 0.01, f"router weight {name} is not random"


def fp8_target(name, w):
    """Weights DeepSeek ships in fp8: every Linear (2-D) weight in the decoder layers except the router mlp.gate."""
    return name.startswith("model.layers.") and w.dim() == 2 and not name.endswith(".mlp.gate.weight")


def quantise_block_fp8(w):
    """w [rows, cols] f32 -> (fp8 e4m3 weight, f32 scale_inv [ceil(rows/128), ceil(cols/128)], dequantised f32)."""
    r, c = w.shape
    br, bc = math.ceil(r / BLOCK), math.ceil(c / BLOCK)
    scale = torch.empty(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            scale[i, j] = blk.abs().max() / FP8_MAX
    full = scale.repeat_interleave(BLOCK, 0)[:r].repeat_interleave(BLOCK, 1)[:, :c]
    q = (w / full).to(torch.float8_e4m3fn)
    deq = q.to(torch.float32) * full
    return q, scale, deq


def build(cls, cfg, seed):
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg).eval()
    randomise(model, seed)
    return model


def load(folder, **kw):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True, **kw)
    assert not any(info.values()), f"{folder}: loading report {info}"  # nothing missing, unexpected or mismatched
    return model.eval()


def save_plain(model, d):
    """Save the way transformers does (it writes the published per-expert layout), minus generation_config.json."""
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    p = os.path.join(d, "generation_config.json")
    if os.path.exists(p):
        os.remove(p)
    byte_level_tokenizer(os.path.join(d, "tokenizer.json"))


def save_fp8(src_dir, d):
    """Quantise src_dir's checkpoint into d; return the folder of its dequantised f32 twin (a temp dir)."""
    os.makedirs(d, exist_ok=True)
    sd = safetensors.torch.load_file(os.path.join(src_dir, "model.safetensors"))
    out, deq = {}, {}
    for k, w in sd.items():
        if fp8_target(k, w):
            q, s, dq = quantise_block_fp8(w)
            out[k], out[k + "_scale_inv"], deq[k] = q, s, dq
        else:
            out[k], deq[k] = w, w
    safetensors.torch.save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = FP8_QUANT_CONFIG
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    byte_level_tokenizer(os.path.join(d, "tokenizer.json"))
    tmp = tempfile.mkdtemp(prefix="deq_")
    safetensors.torch.save_file(deq, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    del cfg["quantization_config"]
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)
    return tmp


def check_fp8(d, deq_dir):
    """The fp8 file against its dequantised twin, with a block loop independent of quantise_block_fp8."""
    q = safetensors.torch.load_file(os.path.join(d, "model.safetensors"))
    deq = safetensors.torch.load_file(os.path.join(deq_dir, "model.safetensors"))
    n = 0
    for k, w in q.items():
        if k.endswith("_scale_inv"):
            continue
        if k + "_scale_inv" not in q:
            assert w.dtype == torch.float32 and torch.equal(w, deq[k]), k
            continue
        s = q[k + "_scale_inv"]
        r, c = w.shape
        assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float32, k
        assert tuple(s.shape) == (-(-r // BLOCK), -(-c // BLOCK)), (k, s.shape)
        wf = w.to(torch.float32)
        assert torch.isfinite(wf).all() and wf.abs().max() <= FP8_MAX, k
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                blk = (slice(i * BLOCK, min(r, (i + 1) * BLOCK)), slice(j * BLOCK, min(c, (j + 1) * BLOCK)))
                assert wf[blk].abs().max() == FP8_MAX, (k, i, j)  # each block's amax lands on 448
                assert torch.equal(wf[blk] * s[i, j], deq[k][blk]), (k, i, j)
        n += 1
    print(f"  {n} fp8 weights check against the dequantised twin")


def check_transformers_fp8(d, golden_cases):
    """transformers' own FP8 loader (dequantize=True works on CPU; needs accelerate) must give the same logits. It infers
    the block from shape / scale-grid, so it only handles matrices without partial blocks (see README)."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        print("  (accelerate not installed: transformers' FP8 loader cross-check skipped)")
        return
    with safetensors.safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    if any(shapes[k[:-len("_scale_inv")]][0] % s[0] or shapes[k[:-len("_scale_inv")]][1] % s[1]
           for k, s in shapes.items() if k.endswith("_scale_inv")):
        print("  (partial blocks: transformers' FP8 dequantize cannot load this; cross-check skipped)")
        return
    model = load(d, quantization_config=transformers.FineGrainedFP8Config(dequantize=True))
    got = logits_tensor(model)
    check_same(os.path.basename(d) + " via FineGrainedFP8Config(dequantize=True)", got,
               [torch.tensor(c["logits"]) for c in golden_cases], tol=1e-5)


def first_moe_gate(model):
    for i, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        if hasattr(mlp, "gate") and hasattr(mlp, "experts"):
            return i, mlp.gate
    raise RuntimeError("no MoE layer")


def run(model):
    cases = []
    with torch.no_grad():
        for seq in SEQUENCES:
            logits = model(torch.tensor([seq])).logits[0]
            cases.append({"tokens": seq, "logits": rows(logits), "argmax": logits.argmax(-1).tolist()})
    layer, gate = first_moe_gate(model)
    seen = {}

    def hook(_mod, args, out):
        seen["input"] = args[0].reshape(-1, args[0].shape[-1]).detach().clone()
        seen["out"] = [o.detach().clone() for o in out]

    h = gate.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.tensor([SEQUENCES[0]]))
    h.remove()
    router_logits, weights, ids = seen["out"]  # every router here returns (logits, top-k weights, top-k ids)
    order = torch.argsort(weights, dim=-1, descending=True)
    routing = {"layer": layer, "tokens": SEQUENCES[0], "gate_input": rows(seen["input"]),
               "router_logits": rows(router_logits), "expert_ids": ids.gather(-1, order).tolist(),
               "expert_weights": rows(weights.gather(-1, order))}
    attn = model.model.layers[0].self_attn
    rope = {"inv_freq": [f32(v) for v in model.model.rotary_emb.inv_freq.tolist()],
            "attention_scaling": f32(model.model.rotary_emb.attention_scaling), "softmax_scale": f32(attn.scaling)}
    return cases, routing, rope, logits_tensor(model)


def logits_tensor(model):
    with torch.no_grad():
        return [model(torch.tensor([seq])).logits[0] for seq in SEQUENCES]


def check_same(name, a, b, tol=0.0):
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
    print(f"  {name}: reloaded, max |dlogit| = {diff:.3g}")
    assert diff <= tol, f"{name}: reloaded model differs ({diff})"


def main():
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}
    doc = {"reference": f"transformers {transformers.__version__}, torch {torch.__version__} "
                        "(CPU, float32, eager attention)",
           "versions": versions, "script": "scripts/gen_moe_goldens.py",
           "float_format": "float32 values printed with 9 significant digits",
           "models": {}, "routing": {}, "rope": {}}
    tmp_dirs = []
    for name, (cls, make_cfg, seed, fp8_src) in SPECS.items():
        print(name)
        d = os.path.join(OUT, name)
        if fp8_src is None:
            model = build(cls, make_cfg(), seed)
            save_plain(model, d)
            cases, routing, rope, ref = run(model)
            check_same(name, ref, logits_tensor(load(d)))
        else:
            if fp8_src == "self":  # build the f32 model to quantise in a temp dir
                src = tempfile.mkdtemp(prefix="src_")
                tmp_dirs.append(src)
                save_plain(build(cls, make_cfg(), seed), src)
            else:
                src = os.path.join(OUT, fp8_src)
            deq_dir = save_fp8(src, d)
            tmp_dirs.append(deq_dir)
            check_fp8(d, deq_dir)
            model = load(deq_dir)  # the dequantised weights, in f32, through transformers' own loading
            cases, routing, rope, _ = run(model)
            check_transformers_fp8(d, cases)
        doc["models"][name] = cases
        doc["routing"][name] = routing
        doc["rope"][name] = rope
        size = os.path.getsize(os.path.join(d, "model.safetensors"))
        print(f"  model.safetensors {size} bytes, greedy ids of seq 0: {cases[0]['argmax']}")
    with open(GOLDEN, "w") as f:
        json.dump(doc, f)
    for t in tmp_dirs:
        shutil.rmtree(t)
    print("wrote", GOLDEN, os.path.getsize(GOLDEN), "bytes")


if __name__ == "__main__":
    main()
