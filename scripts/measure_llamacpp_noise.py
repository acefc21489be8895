#!/usr/bin/env python3
"""How much llama.cpp disagrees with itself on SmolLM2 Q4_1: the noise floor the engine-golden tolerances rest on.

Runs llama.cpp (llama-cpp-python) with its default settings and with flash attention on, and compares with the
golden (F32 KV cache, flash attention off) from scripts/gen_model_goldens.py: first-step top-5 log-probability
differences (top-1 and ranks 2-5) and where the greedy continuation leaves the golden, with the golden's top-1/top-2
margin there. Usage: python3 scripts/measure_llamacpp_noise.py
"""
import json
import math
import os

import llama_cpp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
golden = json.load(open(os.path.join(ROOT, "tests/data/model/smollm2.greedy.json")))
eog = set(golden["eog_ids"])

for label, kw in [("defaults (f16 KV, flash attention auto)", {}), ("F32 KV, flash attention on", dict(type_k=0, type_v=0, flash_attn=True))]:
    llm = llama_cpp.Llama(model_path=MODEL, n_ctx=1024, logits_all=True, verbose=False, n_threads=2, **kw)
    top1, tail, diverged, margins = [], [], 0, []
    for c in golden["cases"]:
        llm.reset()
        llm.eval(c["prompt_ids"])
        out = []
        for step in range(len(c["output_ids"])):
            l = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            if step == 0:
                lp = l - (l.max() + math.log(np.exp(l - l.max()).sum()))
                for rank, (tok, v) in enumerate(c["top5"][0]):
                    (top1 if rank == 0 else tail).append(abs(lp[tok] - v))
            t = int(np.argmax(l))
            out.append(t)
            if t != c["output_ids"][step]:
                diverged += 1
                margins.append(c["top5"][step][0][1] - c["top5"][step][1][1])
                break
            if t in eog:
                break
            llm.eval([t])
    print(f"llama.cpp {label} vs golden: first-step |dlogprob| top-1 max {max(top1):.3f}, ranks 2-5 max {max(tail):.3f}; "
          f"greedy leaves the golden in {diverged}/{len(golden['cases'])} prompts, at golden margins up to "
          f"{max(margins) if margins else 0:.3f}")
