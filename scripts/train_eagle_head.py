#!/usr/bin/env python3
"""Trains a real EAGLE(-2) draft head for SmolLM2-135M-Instruct on its own greedy answers to ShareGPT prompts.

The head and its forward are scripts/gen_eagle_goldens.py's EagleHead (SGLang's LlamaForCausalLMEagle: fc over
concat(embed(t_{i+1}), H_i), one llama layer without input_layernorm, no final norm, the target's tied
embedding / lm_head, frozen). The EAGLE recipe on a CPU budget:

  data     the distinct first human turns of 16..MAX_PROMPT_CHARS characters in
           datasets/cache/ShareGPT_V3_unfiltered_cleaned_split.json, shuffled with a seed: the first N_HELD held out,
           the next N_TRAIN for training; each as `<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`,
           answered greedily (up to MAX_NEW tokens) by SmolLM2 itself through the C++ engine: `servetune serve` on
           models/SmolLM2-135M-Instruct.Q4_1.gguf, CONCURRENCY requests at a time (exact token ids through vLLM's
           return_tokens_as_token_ids; cached per prompt in models/eagle-smollm2/answers.json, where earlier runs'
           answers came one at a time from `servetune generate --json`).
  features H_i for every position of prompt + answer from transformers' f32 dequantisation of the same GGUF
           (teacher forcing, frozen).
  vocab    FR-Spec's draft vocabulary: the HOT_TOKENS tokens most frequent in the training answers (token_map.json,
           for --speculative-token-map); the head is trained and evaluated on the target's head rows for them.
  training every position i predicts t_{i+2}: loss = W_REG * smooth_l1(g_i, H_{i+1}) + W_CE * cross_entropy(
           lm_head_hot(g_i), t_{i+2}) (EAGLE's weights; targets outside the draft vocabulary get no CE), plus with
           UNROLL 2 the same loss for the second chained step (HASS / EAGLE-3's training-time test): fed (t_{i+2}, the
           head's own detached g_i) at position i+1, seeing the real prefix and itself, predicting t_{i+3} and H_{i+2}.
           AdamW, cosine schedule, EPOCHS over the training slice, seeded.
  held-out N_HELD further conversations: top-1 acceptance of the first draft (argmax logits_i == t_{i+2}, answer
           positions), and of chained drafts 2 and 3 (step k feeds (draft k-1, g of step k-1) at the next position,
           tree-masked so it sees the real prefix and its own chain only): P(drafts 1..k all == the greedy answer).

Writes models/eagle-smollm2/ (config.json, model.safetensors in float16, token_map.json, train.json with settings,
token counts, times and acceptance; models/ is not committed) and, when model.safetensors is <= 9 MB, copies them to
tests/data/eagle/smollm2_head/. Deterministic on CPU for a given torch build (fixed seeds and thread count).

Needs: pip install torch transformers accelerate gguf safetensors; the built engine (build/cpu/servetune, or
SERVETUNE=path). Usage: python3 scripts/train_eagle_head.py   (about 90 minutes on two cores; answers and features
are cached)    python3 scripts/train_eagle_head.py --eval DIR   (only the held-out acceptance of the head in DIR)
"""
import collections
import concurrent.futures
import functools
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request

import safetensors.torch
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_eagle_goldens import EagleHead, head_config, load_target, save_head  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHAREGPT = os.path.join(ROOT, "datasets/cache/ShareGPT_V3_unfiltered_cleaned_split.json")
OUT = os.path.join(ROOT, "models/eagle-smollm2")
COMMIT = os.path.join(ROOT, "tests/data/eagle/smollm2_head")
SERVETUNE = os.environ.get("SERVETUNE", os.path.join(ROOT, "build/cpu/servetune"))
SLICE = dict(seed=0, n_train=6300, n_held=60, min_prompt_chars=16, max_prompt_chars=300, max_new=160)
CONCURRENCY = 64
TRAIN = dict(seed=0, epochs=2, batch=4, lr=1e-3, warmup=10, w_reg=1.0, w_ce=0.1, clip=0.5, threads=2, hot_tokens=8192,
             unroll=2)
MAX_BYTES = 9 * 1024 * 1024
CHAIN = 3


def log(msg, t0=[time.time()]):
    print(f"[{time.time() - t0[0]:7.1f}s] {msg}", flush=True)


def pick_prompts():
    with open(SHAREGPT, encoding="utf-8") as f:
        text = f.read()
    try:
        convs = json.loads(text)
    except json.JSONDecodeError:  # PyPI's copy is truncated: keep the complete entries (as gen_sharegpt_slice.py)
        convs = json.loads(text[:text.rfind("\n  },\n  {")] + "\n  }\n]")
    ok = list(dict.fromkeys(  # distinct turns, so no held-out prompt is also a training one
        c["conversations"][0]["value"] for c in convs if c.get("conversations")
        and c["conversations"][0].get("from") == "human"
        and SLICE["min_prompt_chars"] <= len(c["conversations"][0]["value"]) <= SLICE["max_prompt_chars"]))
    order = random.Random(SLICE["seed"]).sample(ok, len(ok))
    held, train = order[:SLICE["n_held"]], order[SLICE["n_held"]:SLICE["n_held"] + SLICE["n_train"]]
    if len(train) < SLICE["n_train"]:
        sys.exit(f"only {len(ok)} distinct prompts of {SLICE['min_prompt_chars']}..{SLICE['max_prompt_chars']} chars: "
                 f"{SLICE['n_train']} training + {SLICE['n_held']} held-out asked for")
    return train + held, len(convs), len(ok)


class Server:
    """`servetune serve` on the target for the answers: greedy, exact ids (return_tokens_as_token_ids)."""

    def __enter__(self):
        self.proc = subprocess.Popen([SERVETUNE, "serve", "--model", os.path.join(ROOT, "models", GGUF), "--port", "0",
                                      "-t", str(TRAIN["threads"]), "--max-total-tokens", "65536",
                                      "--max-running-requests", str(CONCURRENCY)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            self.proc.kill()
            sys.exit(f"servetune serve did not start: {line}{self.proc.stdout.read()}")
        self.url = line.split("listening on ")[1].split()[0]
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)

    def answer(self, prompt):
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ids = self.post("/tokenize", {"prompt": text})["tokens"]
        r = self.post("/v1/completions", {"prompt": ids, "max_tokens": SLICE["max_new"], "temperature": 0,
                                          "logprobs": 0, "return_tokens_as_token_ids": True})
        out = [int(t.removeprefix("token_id:")) for t in r["choices"][0]["logprobs"]["tokens"]]
        return {"prompt_ids": ids, "output_ids": out}


def answers(prompts):
    """Greedy answers, cached per prompt in models/eagle-smollm2/answers.json (reused while max_new is the same)."""
    cache = os.path.join(OUT, "answers.json")
    known = {}
    if os.path.exists(cache):
        with open(cache) as f:
            c = json.load(f)
        if c.get("max_new") == SLICE["max_new"]:
            known = dict(zip(c["prompts"], c["answers"]))
    todo = [p for p in dict.fromkeys(prompts) if p not in known]
    log(f"{len(prompts) - len(todo)} answers cached, {len(todo)} to generate")
    def save():
        os.makedirs(OUT, exist_ok=True)
        with open(cache + ".tmp", "w") as f:
            json.dump({"max_new": SLICE["max_new"], "prompts": list(known), "answers": list(known.values())}, f)
        os.replace(cache + ".tmp", cache)

    if not todo:  # no server to start
        return [known[p] for p in prompts], True
    with Server() as server, concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        for k, (p, r) in enumerate(zip(todo, pool.map(server.answer, todo))):
            known[p] = r
            if k % 500 == 499:
                log(f"  answered {k + 1}/{len(todo)}")
                save()  # an interrupted run keeps what it generated
        save()
    return [known[p] for p in prompts], not todo


def hot_token_ids(ans, vocab, k):
    """FR-Spec's draft vocabulary: the k tokens most frequent in the training answers (then in their prompts, then by
    id), sorted by id."""
    answer_counts, prompt_counts = collections.Counter(), collections.Counter()
    for a in ans:
        answer_counts.update(a["output_ids"])
        prompt_counts.update(a["prompt_ids"])
    ranked = [t for t, _ in answer_counts.most_common()]
    ranked += [t for t, _ in prompt_counts.most_common() if t not in answer_counts]
    seen = set(ranked)
    ranked += [t for t in range(vocab) if t not in seen]
    return sorted(ranked[:k])


def hidden_states(model, seqs, batch=8):
    """H (after model.norm) for every position of each sequence; right padding, so the causal mask suffices."""
    out = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda k: len(seqs[k]))
    with torch.no_grad():
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            n = max(len(seqs[k]) for k in idx)
            ids = torch.tensor([seqs[k] + [2] * (n - len(seqs[k])) for k in idx])
            h = model.model(ids).last_hidden_state
            for j, k in enumerate(idx):
                out[k] = h[j, :len(seqs[k])].clone()
    return out


def cached_hidden_states(model, seqs):
    """hidden_states, kept in models/eagle-smollm2/features.pt for the same sequences (~2.6 GB for the full slice)."""
    key = hashlib.sha256(json.dumps(seqs).encode()).hexdigest()
    path = os.path.join(OUT, "features.pt")
    if os.path.exists(path):
        c = torch.load(path)
        if c["key"] == key:
            return list(torch.split(c["h"], [len(q) for q in seqs])), True
    hs = hidden_states(model, seqs)
    os.makedirs(OUT, exist_ok=True)
    torch.save({"key": key, "h": torch.cat(hs)}, path + ".tmp")
    os.replace(path + ".tmp", path)
    return hs, False


def new_head(cfg):
    """An untrained head for the target config cfg, and its own config (sdpa attention)."""
    hcfg = type(cfg)(**head_config(cfg))
    hcfg._attn_implementation = "sdpa"
    return EagleHead(hcfg), hcfg


def load_head(directory, cfg):
    """A head written by save_head (config.json, model.safetensors, token_map.json), in f32."""
    head, _ = new_head(cfg)
    sd = safetensors.torch.load_file(os.path.join(directory, "model.safetensors"))
    head.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    missing = set(k for k in head.state_dict() if not k.startswith("rotary.")) - set(sd)
    if missing:
        sys.exit(f"{directory}/model.safetensors lacks {sorted(missing)}")
    with open(os.path.join(directory, "token_map.json")) as f:
        hot = torch.tensor(json.load(f))
    return head.eval(), hot


def evaluate(directory):
    """--eval DIR: the held-out acceptance of an existing head (the same held-out slice as training)."""
    torch.set_num_threads(TRAIN["threads"])
    prompts, _, _ = pick_prompts()
    ans, _ = answers(prompts[SLICE["n_train"]:])
    model = load_target(os.path.join(ROOT, "models"), GGUF, attn="sdpa")
    hs = hidden_states(model, [a["prompt_ids"] + a["output_ids"] for a in ans])
    head, hot = load_head(directory, model.config)
    res = acceptance(head, model, ans, hs, hot)
    print(json.dumps({"head": directory, "slice": SLICE, "acceptance": res}, indent=1))


def batches(seqs, hs, order, size):
    """(emb ids t_{i+1}, H_i, targets t_{i+2}, H_{i+1}, mask, targets t_{i+3}, H_{i+2}, mask of those) padded to the
    longest sequence of each batch."""
    for s in range(0, len(order), size):
        idx = order[s:s + size]
        n = max(len(seqs[k]) for k in idx) - 2
        d = hs[idx[0]].shape[1]
        tok, tgt, tgt3 = (torch.zeros(len(idx), n, dtype=torch.long) for _ in range(3))
        mask, mask3 = torch.zeros(len(idx), n, dtype=torch.bool), torch.zeros(len(idx), n, dtype=torch.bool)
        h_in, h_out, h_out2 = torch.zeros(len(idx), n, d), torch.zeros(len(idx), n, d), torch.zeros(len(idx), n, d)
        for j, k in enumerate(idx):
            m, t = len(seqs[k]) - 2, torch.tensor(seqs[k])
            tok[j, :m], tgt[j, :m], mask[j, :m] = t[1:-1], t[2:], True
            h_in[j, :m], h_out[j, :m] = hs[k][:-2], hs[k][1:-1]
            tgt3[j, :m - 1], h_out2[j, :m - 1], mask3[j, :m - 1] = t[3:], hs[k][2:-1], True
        yield tok, h_in, tgt, h_out, mask, tgt3, h_out2, mask3


@functools.lru_cache(maxsize=8)
def unroll_mask(n):
    """Training-time test (HASS, EAGLE-3): block 2 (rows n..2n) holds the head's second chained step at position i + 1,
    fed (t_{i+2}, its own g_i); it sees block 1's positions 0..i and itself, as the engine's draft step sees the head's
    cache. Block 1 is causal."""
    m = torch.full((2 * n, 2 * n), float("-inf"))
    m[:n, :n] = torch.full((n, n), float("-inf")).triu(1)
    m[n:, :n] = torch.full((n, n), float("-inf")).triu(1)
    m[torch.arange(n, 2 * n), torch.arange(n, 2 * n)] = 0.0
    return m.view(1, 1, 2 * n, 2 * n)


def chained(head, embed, lm_hot, hot, seq, h):
    """Drafts of CHAIN chained steps from every position i (real input t_{i+1}, H_i): [CHAIN, L-1] token ids."""
    t = torch.tensor(seq)
    n = len(seq) - 1
    emb, hid, pos = embed[t[1:]], h[:-1], torch.arange(n)
    drafts, parts = [], []
    with torch.no_grad():
        for step in range(CHAIN):
            q = n * (step + 1)
            mask = torch.full((q, q), float("-inf"))
            ar = torch.arange(n)
            for a in range(step + 1):  # block a (chain step a) of query i sees real 0..i, chain steps 1..a of i
                rows = a * n + ar
                mask[rows.unsqueeze(1), ar.unsqueeze(0)] = torch.where(ar.unsqueeze(0) <= ar.unsqueeze(1), 0.0,
                                                                       float("-inf"))
                for c in range(1, a + 1):
                    mask[rows, c * n + ar] = 0.0
            logits, g = head(emb.unsqueeze(0), hid.unsqueeze(0), lm_hot, pos=pos.unsqueeze(0),
                             mask=mask.view(1, 1, q, q))
            d = hot[logits[0, step * n:].argmax(-1)]
            drafts.append(d)
            parts.append(g[0, step * n:])
            emb, hid = torch.cat([embed[t[1:]]] + [embed[x] for x in drafts]), torch.cat([h[:-1]] + parts)
            pos = torch.cat([torch.arange(n) + a for a in range(step + 2)])
    return torch.stack(drafts)


def acceptance(head, model, held, hs, hot):
    embed, lm_head = model.model.embed_tokens.weight, model.lm_head.weight
    lm_hot = lm_head[hot]
    first = [0, 0]
    chain = [[0, 0] for _ in range(CHAIN)]
    agree = [0, 0]
    for a, seq, h in zip(held, [x["prompt_ids"] + x["output_ids"] for x in held], hs):
        p, L = len(a["prompt_ids"]), len(seq)
        d = chained(head, embed, lm_hot, hot, seq, h)
        t = torch.tensor(seq)
        with torch.no_grad():
            f32 = (h @ lm_head.T).argmax(-1)  # the f32 target's own greedy next token at every position
        for i in range(max(p - 2, 0), L - 2):
            first[0] += int(d[0, i] == t[i + 2])
            first[1] += 1
            agree[0] += int(f32[i + 1] == t[i + 2])
            agree[1] += 1
            if i + 1 + CHAIN < L:
                ok = True
                for k in range(CHAIN):
                    ok = ok and bool(d[k, i] == t[i + 2 + k])
                    chain[k][0] += int(ok)
                    chain[k][1] += 1
    res = {"first_draft": first[0] / first[1], "positions": first[1],
           "chain_all_correct": [c[0] / c[1] for c in chain], "chain_positions": chain[0][1],
           "f32_target_agrees_with_engine_answer": agree[0] / agree[1]}
    res["mean_accepted_of_3"] = sum(res["chain_all_correct"])
    return res


def main():
    torch.set_num_threads(TRAIN["threads"])
    torch.manual_seed(TRAIN["seed"])
    t_start = time.time()
    prompts, n_all, n_ok = pick_prompts()
    log(f"ShareGPT: {n_all} conversations, {n_ok} with a first human turn of {SLICE['min_prompt_chars']}.."
        f"{SLICE['max_prompt_chars']} chars; sampled {len(prompts)} (seed {SLICE['seed']})")
    ans, cached = answers(prompts)
    t_data = time.time() - t_start
    seqs = [a["prompt_ids"] + a["output_ids"] for a in ans]
    n_tr = SLICE["n_train"]
    counts = {"train_tokens": sum(map(len, seqs[:n_tr])),
              "train_answer_tokens": sum(len(a["output_ids"]) for a in ans[:n_tr]),
              "held_tokens": sum(map(len, seqs[n_tr:])),
              "held_answer_tokens": sum(len(a["output_ids"]) for a in ans[n_tr:])}
    log(f"answers ready in {t_data:.0f}s: {counts}")

    model = load_target(os.path.join(ROOT, "models"), GGUF, attn="sdpa")
    for p in model.parameters():
        p.requires_grad_(False)
    cfg = model.config
    hs, feat_cached = cached_hidden_states(model, seqs)
    t_feat = time.time() - t_start - t_data
    log(f"H for {sum(map(len, seqs))} positions in {t_feat:.0f}s" + (" (cached)" if feat_cached else ""))

    head, hcfg = new_head(cfg)
    embed, lm_head = model.model.embed_tokens.weight, model.lm_head.weight
    hot = torch.tensor(hot_token_ids(ans[:n_tr], cfg.vocab_size, TRAIN["hot_tokens"]))
    hot_index = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
    hot_index[hot] = torch.arange(len(hot))
    lm_hot = lm_head[hot]
    held_answers = [t for a in ans[n_tr:] for t in a["output_ids"]]
    coverage = sum(int(hot_index[t] >= 0) for t in held_answers) / len(held_answers)
    log(f"draft vocabulary: {len(hot)} tokens, {coverage:.4f} of the held-out answer tokens")
    opt = torch.optim.AdamW([p for p in head.parameters()], lr=TRAIN["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    steps = TRAIN["epochs"] * math.ceil(n_tr / TRAIN["batch"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / TRAIN["warmup"]) * 0.5 * (
        1 + math.cos(math.pi * min(s, steps) / steps)))
    g = torch.Generator().manual_seed(TRAIN["seed"])
    head.train()
    step = 0
    for epoch in range(TRAIN["epochs"]):
        order = torch.randperm(n_tr, generator=g).tolist()
        tot = [0.0, 0.0, 0, 0]
        for tok, h_in, tgt, h_out, mask, tgt3, h_out2, mask3 in batches(seqs, hs, order, TRAIN["batch"]):
            logits, gh = head(embed[tok], h_in, lm_hot)
            hot_tgt = hot_index[tgt]
            ce_mask = mask & (hot_tgt >= 0)  # a target outside the draft vocabulary cannot be drafted
            ce = F.cross_entropy(logits[ce_mask], hot_tgt[ce_mask])
            reg = F.smooth_l1_loss(gh[mask], h_out[mask])
            loss = TRAIN["w_reg"] * reg + TRAIN["w_ce"] * ce
            if TRAIN["unroll"] > 1:  # the second chained step, fed its own (detached) first-step state
                b, n = tok.shape
                pos = torch.cat([torch.arange(n), torch.arange(n) + 1]).expand(b, 2 * n)
                logits2, g2 = head(torch.cat([embed[tok], embed[tgt]], 1), torch.cat([h_in, gh.detach()], 1), lm_hot,
                                   pos=pos, mask=unroll_mask(n))
                logits2, g2 = logits2[:, n:], g2[:, n:]
                hot3 = hot_index[tgt3]
                ce3_mask = mask3 & (hot3 >= 0)
                loss = loss + TRAIN["w_reg"] * F.smooth_l1_loss(g2[mask3], h_out2[mask3]) + \
                    TRAIN["w_ce"] * F.cross_entropy(logits2[ce3_mask], hot3[ce3_mask])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), TRAIN["clip"])
            opt.step()
            sched.step()
            step += 1
            tot[0] += ce.item()
            tot[1] += reg.item()
            tot[2] += int((logits[ce_mask].argmax(-1) == hot_tgt[ce_mask]).sum())
            tot[3] += int(mask.sum())
            if step % 20 == 0:
                log(f"  epoch {epoch} step {step}/{steps}: ce {ce.item():.3f} reg {reg.item():.3f}")
        log(f"epoch {epoch}: mean ce {tot[0] * TRAIN['batch'] / n_tr:.3f}, reg {tot[1] * TRAIN['batch'] / n_tr:.3f}, "
            f"train top-1 {tot[2] / tot[3]:.3f}")
    t_train = time.time() - t_start - t_data - t_feat
    head.eval()
    held = acceptance(head, model, ans[n_tr:], hs[n_tr:], hot)
    held["draft_vocabulary_coverage"] = coverage
    log(f"held-out acceptance: first draft {held['first_draft']:.3f} over {held['positions']} answer positions; "
        f"chained all-correct {[round(x, 3) for x in held['chain_all_correct']]} -> {held['mean_accepted_of_3']:.2f} "
        f"tokens accepted of 3; f32 target == engine answer {held['f32_target_agrees_with_engine_answer']:.3f}")

    save_head(head, hcfg, OUT, torch.float16)
    with open(os.path.join(OUT, "token_map.json"), "w") as f:
        json.dump(hot.tolist(), f)
        f.write("\n")
    size = os.path.getsize(os.path.join(OUT, "model.safetensors"))
    record = {"script": "scripts/train_eagle_head.py", "command": "python3 scripts/train_eagle_head.py",
              "target": "models/" + GGUF, "slice": SLICE, "train": TRAIN, "counts": counts,
              "answers_cached": cached, "features_cached": feat_cached,
              "seconds": {"answers": round(t_data), "features": round(t_feat), "training": round(t_train),
                          "total": round(time.time() - t_start)},
              "acceptance": held, "safetensors_bytes": size,
              "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}
    with open(os.path.join(OUT, "train.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    if size <= MAX_BYTES:
        os.makedirs(COMMIT, exist_ok=True)
        for name in ("config.json", "model.safetensors", "train.json", "token_map.json"):
            shutil.copy(os.path.join(OUT, name), os.path.join(COMMIT, name))
    log(f"wrote {OUT} (model.safetensors {size} bytes, f16)" + (f", copied to {COMMIT}" if size <= MAX_BYTES else ""))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--eval"] and len(sys.argv) == 3:
        evaluate(sys.argv[2])
    elif len(sys.argv) > 1:
        sys.exit("usage: train_eagle_head.py [--eval HEAD_DIR]")
    else:
        main()
