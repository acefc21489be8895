#!/usr/bin/env python3
"""KL divergence of servetune's and llama.cpp's log-probabilities against an f32 reference of the same GGUF.

The reference: the GGUF's weights dequantised to f32 with the `gguf` package and a plain numpy forward of the llama
architecture (RMSNorm, llama.cpp's adjacent-pair RoPE, grouped-query causal attention, SwiGLU, tied or separate
output head), every op in f32: the model as quantised, without the engines' activation quantisation and kernels.

Inputs are two runs over the same chunks (llama-perplexity's windowing):
  servetune perplexity ... --ctx C --chunks K --save-logprobs ST.logprobs
  llama-perplexity -m MODEL -f TEXT -c C -b C --chunks K --kl-divergence-base LLAMA.kld
The chunk tokens come from the files (both must hold the same). Prints, per engine, KL(reference || engine) mean,
median, p99 and max in nats, and top-1 agreement with the reference, then the paired difference of the two engines'
mean KL with a 95% bootstrap interval over chunks (each chunk's activation-quantisation noise is an independent draw
per engine, so the chunks are the unit of resampling); --json writes them. The files are read a chunk at a time
(a servetune file holds 200 KB per position), so hundreds of chunks fit in memory.

Usage: .venv/bin/python scripts/kl_vs_reference.py MODEL.gguf ST.logprobs LLAMA.kld [--json OUT]
"""
import argparse
import json
import struct
import sys

import numpy as np
import gguf


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else [f.parts[i].tolist()[0] for i in f.data]


class Reference:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        arch = bytes(r.fields['general.architecture'].parts[r.fields['general.architecture'].data[0]]).decode()
        if arch != 'llama':
            sys.exit(f'{path}: architecture {arch}; this reference implements llama only')
        self.n_layers = field(r, 'llama.block_count')
        self.n_heads = field(r, 'llama.attention.head_count')
        self.n_kv = field(r, 'llama.attention.head_count_kv')
        self.eps = field(r, 'llama.attention.layer_norm_rms_epsilon')
        self.theta = field(r, 'llama.rope.freq_base', 10000.0)
        self.w = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            self.w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else a
        self.hidden = self.w['token_embd.weight'].shape[1]
        self.head_dim = self.hidden // self.n_heads
        self.out = self.w.get('output.weight', self.w['token_embd.weight'])

    def norm(self, x, w):
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(self.eps))).astype(np.float32) * w

    def rope(self, x, n):
        # llama.cpp's NORM rope on (x[2i], x[2i+1]) pairs (convert_hf_to_gguf permuted q/k to make it HF's).
        d = self.head_dim
        inv = (1.0 / (self.theta ** (np.arange(0, d, 2, dtype=np.float64) / d))).astype(np.float32)
        ang = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def logprobs(self, tokens):
        n, hd = len(tokens), self.head_dim
        x = self.w['token_embd.weight'][np.asarray(tokens)]
        mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
        group = self.n_heads // self.n_kv
        for l in range(self.n_layers):
            b = f'blk.{l}.'
            h = self.norm(x, self.w[b + 'attn_norm.weight'])
            q = self.rope((h @ self.w[b + 'attn_q.weight'].T).reshape(n, self.n_heads, hd), n)
            k = self.rope((h @ self.w[b + 'attn_k.weight'].T).reshape(n, self.n_kv, hd), n)
            v = (h @ self.w[b + 'attn_v.weight'].T).reshape(n, self.n_kv, hd)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            s = np.einsum('qhd,khd->hqk', q, k) / np.float32(np.sqrt(hd)) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = np.einsum('hqk,khd->qhd', s, v).reshape(n, self.hidden)
            x = x + a @ self.w[b + 'attn_output.weight'].T
            h = self.norm(x, self.w[b + 'ffn_norm.weight'])
            g = h @ self.w[b + 'ffn_gate.weight'].T
            x = x + ((g / (1 + np.exp(-g))) * (h @ self.w[b + 'ffn_up.weight'].T)) @ self.w[b + 'ffn_down.weight'].T
        logits = self.norm(x, self.w['output_norm.weight']) @ self.out.T
        logits = logits.astype(np.float64)
        return logits - logits.max(-1, keepdims=True) - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))


def read_servetune(path):
    with open(path, 'rb') as f:
        if f.read(8) != b'STLOGP01':
            sys.exit(f'{path}: not a servetune --save-logprobs file')
        ctx, vocab, chunks = struct.unpack('<3i', f.read(12))
        tokens = np.frombuffer(f.read(4 * ctx * chunks), dtype=np.int32).reshape(chunks, ctx)
    first = ctx // 2
    rows = np.memmap(path, dtype=np.float32, mode='r', offset=20 + 4 * ctx * chunks, shape=(chunks, ctx - 1 - first, vocab))
    return ctx, vocab, tokens, rows


class LlamaRows:
    """llama-perplexity's --kl-divergence-base file: per position a float32 scale and minimum, then uint16 codes."""

    def __init__(self, path, vocab_expected):
        with open(path, 'rb') as f:
            if f.read(8) != b'_logits_':
                sys.exit(f'{path}: not a llama-perplexity --kl-divergence-base file')
            ctx, vocab, chunks = struct.unpack('<3i', f.read(12))
            if vocab != vocab_expected:
                sys.exit(f'{path}: vocabulary {vocab}, servetune file {vocab_expected}')
            self.tokens = np.frombuffer(f.read(4 * ctx * chunks), dtype=np.int32).reshape(chunks, ctx)
        self.ctx, self.vocab = ctx, vocab
        nv = 2 * ((vocab + 1) // 2) + 4
        self.raw = np.memmap(path, dtype=np.uint16, mode='r', offset=20 + 4 * ctx * chunks,
                             shape=(chunks, ctx - 1 - ctx // 2, nv))

    def __getitem__(self, c):
        r = self.raw[c]
        head = r[:, :4].copy().view(np.float32).astype(np.float64)  # scale, min log-prob
        return head[:, 1:2] + head[:, 0:1] * r[:, 4:4 + self.vocab].astype(np.float64)


def kl_rows(ref, rows):
    # As llama-perplexity sums it: over the reference's tokens with log-probability above -16 (its file keeps 16 nats).
    p = np.where(ref > -16.0, np.exp(ref), 0.0)
    return np.maximum((p * (ref - rows)).sum(-1), 0.0), ref.argmax(-1) == rows.argmax(-1)


def stats(kl, agree):
    kl = kl.ravel()
    return {'kl_mean': float(kl.mean()), 'kl_median': float(np.median(kl)), 'kl_p99': float(np.percentile(kl, 99)),
            'kl_max': float(kl.max()), 'top1_agreement': float(agree.mean())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('model')
    ap.add_argument('servetune')
    ap.add_argument('llama')
    ap.add_argument('--json')
    a = ap.parse_args()
    ctx, vocab, tokens, st = read_servetune(a.servetune)
    ll = LlamaRows(a.llama, vocab)
    if ll.ctx != ctx or ll.tokens.shape != tokens.shape or not np.array_equal(ll.tokens, tokens):
        sys.exit('the two runs scored other chunks (same text, ctx and chunks needed)')
    model = Reference(a.model)
    first = ctx // 2
    kl = {'servetune': [], 'llama.cpp': []}
    agree = {'servetune': [], 'llama.cpp': []}
    for c in range(tokens.shape[0]):
        ref = model.logprobs(tokens[c])[first:ctx - 1]
        for name, rows in (('servetune', st[c].astype(np.float64)), ('llama.cpp', ll[c])):
            k, g = kl_rows(ref, rows)
            kl[name].append(k)
            agree[name].append(g)
    out = {'model': a.model, 'ctx': ctx, 'chunks': int(tokens.shape[0]), 'scored': int(tokens.shape[0] * (ctx - 1 - first))}
    for name in ('servetune', 'llama.cpp'):
        out[name] = stats(np.array(kl[name]), np.array(agree[name]))
        s = out[name]
        print(f"{name:10s} KL vs f32 reference: mean {s['kl_mean']:.6f} median {s['kl_median']:.6f} p99 {s['kl_p99']:.6f} "
              f"max {s['kl_max']:.6f}; top-1 agreement {100 * s['top1_agreement']:.2f}%")
    d = np.array(kl['servetune']).mean(1) - np.array(kl['llama.cpp']).mean(1)
    rng = np.random.default_rng(0)
    boot = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(4000)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    base = out['llama.cpp']['kl_mean']
    out['difference'] = {'mean': float(d.mean()), 'ci95': [float(lo), float(hi)], 'chunks_servetune_closer': int((d < 0).sum())}
    print(f"servetune - llama.cpp mean KL: {d.mean():+.6f} ({100 * d.mean() / base:+.1f}%), 95% interval over chunks "
          f"[{100 * lo / base:+.1f}%, {100 * hi / base:+.1f}%]; servetune closer on {(d < 0).sum()} of {len(d)} chunks")
    if a.json:
        json.dump(out, open(a.json, 'w'), indent=2)


if __name__ == '__main__':
    main()
