#!/usr/bin/env python3
"""Greedy-continuation goldens from llama.cpp (through llama-cpp-python) for the engine-core tests.

For each model and prompt: the prompt ids llama.cpp tokenizes, its greedy continuation (up to 64 tokens,
stopping at an end-of-generation token), and the top-5 log-probabilities of every generated position.
llama.cpp runs with an F32 KV cache and flash attention off (its most precise CPU path).

Usage: python3 scripts/gen_model_goldens.py [--smollm2 models/SmolLM2-135M-Instruct.Q4_1.gguf]
Writes tests/data/model/<model>.greedy.json.
"""
import argparse
import json
import math
import os

import llama_cpp
import numpy as np

STORY_PROMPTS = [
    "Once upon a time",
    "One day, a little boy named Tim",
    "The cat sat on the mat and",
    "Lily and her mom went to the park.",
    "There was a big red ball",
    "Sam was sad because",
    "In a small house lived",
    "The sun was shining and the birds",
    "A",
    "Tom had a toy car. He",
]

SMOL_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a faraway land,",
    "The three primary colors are",
    "Water boils at",
    "import numpy as np\n\nx = np.",
    "Q: What is 12 times 12?\nA:",
    "The quick brown fox",
]

SMOL_CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in one sentence.",
    "List three fruits.",
]

F32 = 0  # GGML_TYPE_F32


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


def run(llm, prompt_ids, max_tokens, eog):
    llm.reset()
    llm.eval(prompt_ids)
    out, top = [], []
    for _ in range(max_tokens):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        lp = log_softmax(logits)
        order = np.argsort(-lp, kind="stable")[:5]
        tok = int(np.argmax(logits))
        out.append(tok)
        top.append([[int(i), float(lp[i])] for i in order])
        if tok in eog:
            break
        llm.eval([tok])
    return out, top


def eog_ids(llm):
    ids = {llm.token_eos()}
    for text in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        toks = llm.tokenize(text.encode(), add_bos=False, special=True)
        if len(toks) == 1:
            ids.add(toks[0])
    return ids


def chatml(user):
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def generate(path, prompts, chats, out_path):
    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_batch=512, n_threads=2, logits_all=True, type_k=F32,
                          type_v=F32, flash_attn=False, verbose=False, seed=0)
    eog = eog_ids(llm)
    cases = []
    for p in prompts:
        ids = llm.tokenize(p.encode(), add_bos=True, special=False)
        out, top = run(llm, ids, 64, eog)
        cases.append({"kind": "plain", "prompt": p, "prompt_ids": ids, "output_ids": out, "top5": top})
    for c in chats:
        text = chatml(c)
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        out, top = run(llm, ids, 64, eog)
        cases.append({"kind": "chat", "user": c, "prompt": text, "prompt_ids": ids, "output_ids": out, "top5": top})
    doc = {
        "reference": f"llama-cpp-python {llama_cpp.__version__} (vendored llama.cpp), CPU, F32 KV cache, flash_attn off, 2 threads",
        "script": "scripts/gen_model_goldens.py",
        "model": os.path.basename(path),
        "eog_ids": sorted(eog),
        "cases": cases,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=0)
    print(f"wrote {out_path}: {len(cases)} cases")


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--stories", default=os.path.join(root, "tests/data/stories260K.gguf"))
    ap.add_argument("--smollm2", default=os.path.join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    outdir = os.path.join(root, "tests/data/model")
    os.makedirs(outdir, exist_ok=True)
    generate(args.stories, STORY_PROMPTS, [], os.path.join(outdir, "stories260K.greedy.json"))
    generate(args.smollm2, SMOL_PROMPTS, SMOL_CHATS, os.path.join(outdir, "smollm2.greedy.json"))


if __name__ == "__main__":
    main()
