#!/usr/bin/env python3
"""Logits goldens from HF transformers (CPU torch) for random-weight llama-family models in safetensors form.

Builds two tiny models with transformers itself (seeded), saves them as f32 safetensors + config.json + a byte-level
tokenizer.json under tests/data/hf_models/<name>/, and records transformers' logits for fixed token sequences in
logits.json. The C++ test loads the same directories through servetune's safetensors path and compares logits.
Needs: pip install torch transformers tokenizers safetensors  (versions are recorded in the golden).
Usage: python3 scripts/gen_hf_goldens.py
"""
import json
import os

import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests/data/hf_models")

SEQUENCES = [[1, 17, 200, 45, 3, 99, 250, 7, 7, 7, 301, 12], [1, 5, 6, 7, 8], [260]]

SPECS = {
    # GQA 2:1, separate lm_head, llama3 rope scaling on a context small enough for every band to matter.
    "llama_tiny": dict(cls="LlamaForCausalLM", config=transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.1,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}, rope_theta=500000.0)),
    # GQA 4:1, tied embeddings, q/k/v biases.
    "qwen2_tiny": dict(cls="Qwen2ForCausalLM", config=transformers.Qwen2Config(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.1,
        tie_word_embeddings=True, rope_theta=1000000.0, bos_token_id=1, eos_token_id=2)),
}


def byte_level_tokenizer(path):
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(path)


def main():
    torch.manual_seed(0)
    doc = {"reference": f"transformers {transformers.__version__}, torch {torch.__version__} (CPU, float32, eager attention)",
           "script": "scripts/gen_hf_goldens.py", "models": {}}
    for name, spec in SPECS.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        cfg = spec["config"]
        cfg._attn_implementation = "eager"
        model = getattr(transformers, spec["cls"])(cfg).eval()
        model.save_pretrained(d, safe_serialization=True)
        byte_level_tokenizer(os.path.join(d, "tokenizer.json"))
        cases = []
        with torch.no_grad():
            for seq in SEQUENCES:
                logits = model(torch.tensor([seq])).logits[0]
                cases.append({"tokens": seq, "logits": [[float(v) for v in row] for row in logits]})
        doc["models"][name] = cases
    with open(os.path.join(OUT, "logits.json"), "w") as f:
        json.dump(doc, f)
    for extra in ("generation_config.json",):
        for name in SPECS:
            p = os.path.join(OUT, name, extra)
            if os.path.exists(p):
                os.remove(p)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
