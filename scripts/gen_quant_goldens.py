#!/usr/bin/env python3
"""Generates the (de)quantization goldens in tests/data/quant/ from the gguf Python package (gguf.quants).

Usage: python3 scripts/gen_quant_goldens.py [--models-dir models]
       python3 scripts/gen_quant_goldens.py --dump GGUF_FILE DIR   (writes DIR/<tensor>.f32 for every tensor: the
       full expected output, which test_quant compares element by element when SERVETUNE_QUANT_EXPECTED_DIR=DIR)
Needs: pip install gguf==0.19.0 numpy. Deterministic: rerunning with the same versions rewrites identical files.

Outputs (see tests/data/quant/README.md):
  real_<file>.txt   per tensor of a real GGUF file: name, type, element count, poly64 hashes of the float32
                    output per 2^20-element chunk, and sampled values (index=float32 bits)
  synthetic.txt     manifest of the synthetic cases below
  dequant_<type>.in / .out   random blocks (finite fp16 scales) and gguf.quants.dequantize's float32 output
  quant_<type>.in / .out     float32 inputs and gguf.quants.quantize's raw blocks
The poly64 hash of float32 values with bit patterns w_0..w_{n-1} (uint32) is
  h = 0xcbf29ce484222325; for each w: h = (h * 0x100000001b3 + w) mod 2^64.
"""

import argparse
import hashlib
import os
import sys
import zlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "quant")

H0 = 0xCBF29CE484222325
K = 0x100000001B3
MASK = (1 << 64) - 1
CHUNK = 1 << 20
# POW[j] = K^j mod 2^64 for j in [0, CHUNK]
POW = np.concatenate([[np.uint64(1)], np.cumprod(np.full(CHUNK, K, dtype=np.uint64))])


def gguf_version():
    from importlib.metadata import version
    return version("gguf")


def poly64(words: np.ndarray) -> int:
    """poly64 of up to CHUNK uint32 words (vectorised Horner: h0*K^n + sum w_j K^(n-1-j))."""
    n = words.size
    assert n <= CHUNK
    acc = int((words.astype(np.uint64) * POW[:n][::-1]).sum(dtype=np.uint64))
    return (H0 * int(POW[n]) + acc) & MASK


def chunk_hashes(values: np.ndarray) -> list[str]:
    words = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32)
    if words.size == 0:
        return ["%016x" % H0]
    return ["%016x" % poly64(words[i:i + CHUNK]) for i in range(0, words.size, CHUNK)]


def real_file_golden(path: str, label: str, out_name: str) -> None:
    reader = gguf.GGUFReader(path)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    lines = [
        f"# servetune dequantization golden for {label}, made by scripts/gen_quant_goldens.py",
        f"# reference: gguf {gguf_version()} (gguf.quants.dequantize), numpy {np.__version__}",
        f"# source sha256 {sha}",
        "# line: name type n_elements chunk_hashes(poly64 per 2^20 elements, comma-separated) samples(index=f32 bits)",
    ]
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32, copy=False)
        n = values.size
        assert n == int(t.n_elements), t.name
        rng = np.random.default_rng(zlib.crc32(t.name.encode()))
        idx = sorted({0, n - 1, *(int(i) for i in rng.integers(0, n, size=4))})
        bits = values.view(np.uint32)
        samples = ",".join(f"{i}={int(bits[i]):08x}" for i in idx)
        lines.append(f"{t.name} {t.tensor_type.name} {n} {','.join(chunk_hashes(values))} {samples}")
    with open(os.path.join(OUT, out_name), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out_name}: {len(reader.tensors)} tensors")


# Byte offsets of the fp16 scale fields inside one block, per type.
FP16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}


def random_fp16_scale(rng: np.random.Generator, block: int, field: int) -> int:
    """Finite fp16 bit patterns: mostly typical magnitudes, plus zero, subnormals, the largest finite, negatives."""
    special = [0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0xFBFF, 0x0400, 0x3C00]
    if block < len(special) and field == 0:
        return special[block]
    mag = np.float16(np.exp(rng.uniform(np.log(1e-4), np.log(4.0))))
    sign = -1 if rng.random() < 0.3 else 1
    return int(np.array([sign * mag], dtype=np.float16).view(np.uint16)[0])


def synthetic_dequant(qtype: Q, n_blocks: int, rng: np.random.Generator) -> tuple[bytes, np.ndarray]:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for b in range(n_blocks):
        for f, off in enumerate(FP16_FIELDS[qtype]):
            v = random_fp16_scale(rng, b, f)
            raw[b, off] = v & 0xFF
            raw[b, off + 1] = v >> 8
    out = dequantize(raw, qtype).reshape(-1).astype(np.float32, copy=False)
    assert out.size == n_blocks * block_size
    assert np.all(np.isfinite(out)), qtype.name
    return raw.tobytes(), out


def quant_inputs(qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Blocks of 32 floats that exercise each quantizer's edge cases; F16/BF16 get special values too."""
    blocks = [
        rng.normal(0, 1, 32),
        rng.normal(0, 0.02, 32),
        rng.uniform(-3, 7, 32),
        np.zeros(32),
        np.full(32, 0.75),
        np.full(32, -2.5),
        np.concatenate([[5.0], np.zeros(31)]),
        np.concatenate([[-5.0], np.zeros(31)]),
        # magnitude ties: max element appears with both signs (argmax must pick the first)
        np.concatenate([[-3.0, 3.0], rng.uniform(-1, 1, 30)]),
        np.concatenate([[3.0, -3.0], rng.uniform(-1, 1, 30)]),
        # exact halves after scaling by 127/amax = 1 (round-half-away vs half-even differ here)
        np.concatenate([[127.0], np.arange(-15.5, 15.0, 1.0)]),
        # integers on the 4/5-bit grids and their midpoints
        np.concatenate([[-8.0], np.arange(-7.5, 8.0, 0.5)[:31]]),
        np.concatenate([[16.0], np.arange(0.0, 15.5, 0.5)]),
        rng.normal(0, 1e4, 32),   # scale overflows nothing; fp16 d near its range
        rng.normal(0, 1e5, 32),   # d overflows fp16 for the legacy types
        rng.normal(0, 1e-6, 32),  # d lands in fp16 subnormals
        rng.normal(0, 1e-9, 32),  # d flushes to fp16 zero
    ]
    x = np.concatenate(blocks).astype(np.float32)
    if qtype in (Q.F16, Q.BF16):
        special = np.array([0.0, -0.0, 1.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 6e-8, 3e-8, 2.98e-8, 1e-8,
                            6.1e-5, 1.0 + 2**-11, 1.0 + 3 * 2**-11, np.inf, -np.inf, 3.4e38, 1e-40, -1e-45,
                            1.0 + 2**-8, 1.0 + 3 * 2**-8, 2**-126, 1.5, -7.25, 1234.5678, 0.1, 1.0 / 3.0,
                            np.pi, -np.e, 1e-3, 42.0], dtype=np.float32)
        bits = rng.integers(0, 2**32, size=224, dtype=np.uint64).astype(np.uint32).view(np.float32)
        bits = bits[np.isfinite(bits)]
        x = np.concatenate([x, special, bits])
        x = x[: x.size // 32 * 32]
    return x


def write(name: str, data: bytes) -> None:
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=os.path.join(ROOT, "models"))
    ap.add_argument("--dump", nargs=2, metavar=("GGUF_FILE", "DIR"))
    args = ap.parse_args()
    if args.dump:
        os.makedirs(args.dump[1], exist_ok=True)
        for t in gguf.GGUFReader(args.dump[0]).tensors:
            values = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32, copy=False)
            values.tofile(os.path.join(args.dump[1], t.name + ".f32"))
        return 0
    os.makedirs(OUT, exist_ok=True)

    real_file_golden(os.path.join(ROOT, "tests", "data", "stories260K.gguf"), "tests/data/stories260K.gguf",
                     "real_stories260K.txt")
    smol = os.path.join(args.models_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(smol):
        real_file_golden(smol, "models/SmolLM2-135M-Instruct.Q4_1.gguf", "real_smollm2_q4_1.txt")
    else:
        print(f"warning: {smol} missing (run scripts/setup.sh); its golden was not regenerated", file=sys.stderr)

    rng = np.random.default_rng(20240601)
    manifest = [
        "# servetune synthetic (de)quantization goldens, made by scripts/gen_quant_goldens.py",
        f"# reference: gguf {gguf_version()} (gguf.quants.dequantize / quantize), numpy {np.__version__}",
        "# dequant TYPE N_ELEMENTS INPUT(raw blocks) OUTPUT(float32 LE)",
        "# quant TYPE N_ELEMENTS INPUT(float32 LE) OUTPUT(raw blocks)",
        "# dequant_all16 TYPE POLY64: dequantize of all 65536 16-bit patterns in order 0..65535",
    ]
    for qtype, n_blocks in [(Q.Q4_0, 16), (Q.Q4_1, 16), (Q.Q5_0, 16), (Q.Q5_1, 16), (Q.Q8_0, 16),
                            (Q.Q2_K, 8), (Q.Q3_K, 8), (Q.Q4_K, 8), (Q.Q5_K, 8), (Q.Q6_K, 8)]:
        raw, out = synthetic_dequant(qtype, n_blocks, rng)
        stem = f"dequant_{qtype.name.lower()}"
        write(stem + ".in", raw)
        write(stem + ".out", out.tobytes())
        manifest.append(f"dequant {qtype.name} {out.size} {stem}.in {stem}.out")

    all16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for qtype in (Q.F16, Q.BF16):
        out = dequantize(all16.view(np.uint8) if qtype == Q.BF16 else all16, qtype)
        out = np.asarray(out, dtype=np.float32).reshape(-1)
        assert out.size == 65536
        manifest.append(f"dequant_all16 {qtype.name} {poly64(out.view(np.uint32)):016x}")

    for qtype in (Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        x = quant_inputs(qtype, rng)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            q = quantize(x.reshape(-1, 32), qtype)
        stem = f"quant_{qtype.name.lower()}"
        write(stem + ".in", x.tobytes())
        write(stem + ".out", np.ascontiguousarray(q).view(np.uint8).tobytes())
        manifest.append(f"quant {qtype.name} {x.size} {stem}.in {stem}.out")

    with open(os.path.join(OUT, "synthetic.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    print(f"synthetic.txt: {len(manifest) - 5} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
